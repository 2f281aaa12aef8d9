"""How fast the anchor's GPT learns from each initialisation, on the same data in the same order.

- `mlx`: MLX's nn defaults, as the anchor and lmx's models/gpt2.lmx initialise (linear weights and
  biases uniform in +-1/sqrt(in), embeddings normal with std 1/sqrt(d)).
- `gpt2`: GPT-2's published one (Radford et al. 2019; nanoGPT): every linear weight and embedding
  normal with std 0.02, biases zero, the residual projections (attention's and the MLP's output)
  with std 0.02/sqrt(2 n_layers).

    python3 bench/init_compare.py --config small --data data/shakespeare.txt --steps 300
    python3 bench/init_compare.py --config gpt2 --data random --batch 16 --seq 1024 --steps 35

`--data PATH` trains on a byte-level text (vocab 256: the tiny, small and medium configs) with
batches of random windows, and reports the loss of 8 fixed held-out batches (the text's last 10%)
as it goes; `--data random` trains on one batch of random tokens, as the anchor's benchmark does.
The step is the anchor's: AdamW (MLX's, weight decay 0.01 on every parameter), clip 1.0, constant
learning rate (--lr, 3e-4 as the anchor). Prints one JSON line per init with the losses.
"""

import argparse
import json
import math
import os
import sys
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_same_init import CONFIGS, GPT, clip_by_global_norm  # noqa: E402


def gpt2_init(model, layers, key):
    """GPT-2's initialisation of `model`'s parameters, drawn from `key`."""
    residual = 0.02 / math.sqrt(2 * layers)
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    new = []
    for (name, value), k in zip(params, keys):
        if name.startswith("ln") or ".ln" in name:
            new.append((name, value))  # LayerNorm: ones and zeros, as before
        elif name.endswith(".bias"):
            new.append((name, mx.zeros_like(value)))
        else:
            std = residual if name.endswith(("proj.weight", "out.weight")) else 0.02
            new.append((name, std * mx.random.normal(value.shape, key=k)))
    model.load_weights(new, strict=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    p.add_argument("--inits", default="mlx,gpt2")
    p.add_argument("--data", default="random")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval_every", type=int, default=50)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="default", choices=["default", "cpu", "gpu"])
    args = p.parse_args()
    if args.device != "default":
        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    d, layers, heads, vocab = CONFIGS[args.config]

    if args.data == "random":
        mx.random.seed(1)
        fixed = mx.random.randint(0, vocab, (args.batch, args.seq + 1))
        train_text, held_out = None, None
    else:
        with open(args.data, "rb") as f:
            text = mx.array(list(f.read()), dtype=mx.int32)
        cut = int(text.size * 0.9)
        train_text, held_out = text[:cut], text[cut:]

    def windows(text, starts):
        rows = mx.stack([text[s : s + args.seq + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]

    for init in args.inits.split(","):
        mx.random.seed(0)
        model = GPT(d, layers, heads, vocab, args.seq)
        if init == "gpt2":
            gpt2_init(model, layers, mx.random.key(0))
        elif init != "mlx":
            raise SystemExit(f"unknown init {init}: use mlx or gpt2")
        if args.dtype == "bfloat16":
            model.set_dtype(mx.bfloat16)
        optimizer = optim.AdamW(learning_rate=args.lr, weight_decay=0.01)
        optimizer.init(model.trainable_parameters())

        def loss_fn(model, x, y):
            logits = model(x)
            return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")

        loss_and_grad = nn.value_and_grad(model, loss_fn)
        state = [model.state, optimizer.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def step(x, y):
            loss, grads = loss_and_grad(model, x, y)
            grads, _ = clip_by_global_norm(grads, 1.0)
            optimizer.update(model, grads)
            return loss

        def held_out_loss():
            key = mx.random.key(2)
            starts = mx.random.randint(0, held_out.size - args.seq - 1, (8, args.batch), key=key)
            return sum(loss_fn(model, *windows(held_out, row)).item() for row in starts) / 8

        order = mx.random.key(1)  # the same batches in the same order for every init
        losses, evals = [], []
        for i in range(args.steps):
            if train_text is None:
                x, y = fixed[:, :-1], fixed[:, 1:]
            else:
                order, sub = mx.random.split(order)
                starts = mx.random.randint(0, train_text.size - args.seq - 1, (args.batch,), key=sub)
                x, y = windows(train_text, starts)
            loss = step(x, y)
            mx.eval(loss, state)
            losses.append(round(loss.item(), 5))
            if held_out is not None and ((i + 1) % args.eval_every == 0 or i + 1 == args.steps):
                evals.append((i + 1, round(held_out_loss(), 5)))
                print(f"{init} step {i + 1}: train {losses[-1]:.4f} held-out {evals[-1][1]:.4f}",
                      file=sys.stderr, flush=True)
        print(json.dumps({
            "init": init, "config": args.config, "data": args.data, "batch": args.batch,
            "seq": args.seq, "lr": args.lr, "dtype": args.dtype, "losses": losses,
            "held_out": evals,
        }), flush=True)


if __name__ == "__main__":
    main()
