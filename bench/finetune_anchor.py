"""mlx-lm's own LoRA trainer (`mlx_lm.lora`'s `run` step by step, with its defaults) on a model folder and a
data folder, reporting what it measures itself: tokens per second and peak memory per report.

    python bench/finetune_anchor.py MODEL DATA --iters 60 --batch 4 --rank 8 --layers 16 \
        [--seq 2048] [--json OUT.jsonl]

Prints one JSON object: the settings, each report's tokens/s, and the median over the reports
after the first (the first holds compilation and warm-up).
"""

import argparse
import json
import statistics
import tempfile
import types

import numpy as np
from mlx_lm import lora
from mlx_lm.tuner.datasets import load_dataset
from mlx_lm.tuner.trainer import TrainingCallback
from mlx_lm.utils import load


class Reports(TrainingCallback):
    def __init__(self):
        self.train = []

    def on_train_loss_report(self, info):
        self.train.append(info)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--report", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    settings = dict(lora.CONFIG_DEFAULTS)
    settings.update(
        model=args.model,
        data=args.data,
        train=True,
        iters=args.iters,
        batch_size=args.batch,
        num_layers=args.layers,
        max_seq_length=args.seq,
        steps_per_report=args.report,
        steps_per_eval=args.iters + 1,
        save_every=args.iters + 1,
        val_batches=1,
        adapter_path=tempfile.mkdtemp(),
        lora_parameters=dict(rank=args.rank, dropout=0.0, scale=20.0),
        test=False,
    )
    settings = types.SimpleNamespace(**settings)
    # `lora.run` with our callback: `run` itself replaces the callback it is given.
    np.random.seed(settings.seed)
    model, tokenizer = load(settings.model)
    train_set, valid_set, _ = load_dataset(settings, tokenizer)
    reports = Reports()
    lora.train_model(settings, model, train_set, valid_set, reports)
    speeds = [r["tokens_per_second"] for r in reports.train]
    result = dict(
        tool="mlx-lm",
        iters=args.iters,
        batch=args.batch,
        rank=args.rank,
        layers=args.layers,
        tokens_per_s=speeds,
        median_tokens_per_s=statistics.median(speeds[1:] or speeds),
        peak_memory_gb=max(r["peak_memory"] for r in reports.train),
        final_loss=reports.train[-1]["train_loss"],
    )
    print(json.dumps(result))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
