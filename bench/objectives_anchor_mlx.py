"""DPO steps and GRPO updates in Python MLX, lmxlab's way: the anchor of bench/objectives-gpu.sh.

mlx-lm's own `llama` Model at the size given (TinyLlama-1.1B's by default) is the policy, and a
second instance holding the policy's starting weights is the frozen reference. The losses are
lmxlab's `dpo_loss` and `grpo_loss` as lmx computes them (the formulas of
lmx-runtime/tests/fixtures/objectives/make_fixtures.py, which lmx's losses match within 1e-5),
written the way lmxlab's training code writes them: separate forward passes of the policy and
the reference over the chosen and the rejected sequences, `log_softmax` and `take_along_axis`
for the log-probabilities, the loss differentiated with `nn.value_and_grad(model, ...)`; the
update as lmx's `llama.lmx` step makes it (AdamW with betas 0.9 and 0.95, eps 1e-5, weight decay
0.1, global-norm clip 1.0); the whole step `mx.compile`d over the model's and the optimizer's
state, as mlx-lm's trainer compiles its step.

- dpo: `--batch` pairs, each a chosen and a rejected sequence of `--seq` inputs (and one more id
  for the last target), the first `--prompt-len` ids a prompt whose targets are masked; lmx's
  rows are the same (`--batch-size` pairs of `--seq-len` ids a response).
- grpo: the update on one batch of rollouts: `--prompts` x `--group` completions `--width` ids
  wide, the first `--prompt-len` ids the prompt (masked), rewards normalised within each group,
  the clipped surrogate (`--epsilon`) with the KL to the reference (`--beta`); lmx's update
  trains rows of the same shape (prompt and completion, `width` ids).

    python objectives_anchor_mlx.py dpo --batch 4 --seq 512
    python objectives_anchor_mlx.py grpo --prompts 4 --group 8 --width 256

Each step gets fresh random ids (and rewards), made before its timer starts. Prints one JSON
line: the settings, the parameter count, the median ms a step over the timed steps (after
--warmup), tokens/s (the policy's forward tokens a step over that time), peak memory, last loss.
"""

import argparse
import json
import statistics
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from mlx_lm.models import llama

IGNORE = -100


def sequence_log_probs(logits, targets):
    """Per-token log-probabilities of the targets, 0 where a target is ignored (prompt)."""
    log_probs = nn.log_softmax(logits.astype(mx.float32), axis=-1)
    picked = mx.take_along_axis(log_probs, mx.maximum(targets, 0)[..., None], axis=-1)
    return mx.where(targets >= 0, picked.squeeze(-1), 0.0)


def dpo_loss(model, ref_model, chosen, chosen_targets, rejected, rejected_targets, beta):
    """lmxlab: L = -log(sigmoid(beta * (log_ratio_chosen - log_ratio_rejected)))."""
    chosen_logps = sequence_log_probs(model(chosen), chosen_targets).sum(-1)
    chosen_ref_logps = sequence_log_probs(ref_model(chosen), chosen_targets).sum(-1)
    rejected_logps = sequence_log_probs(model(rejected), rejected_targets).sum(-1)
    rejected_ref_logps = sequence_log_probs(ref_model(rejected), rejected_targets).sum(-1)
    chosen_rewards = beta * (chosen_logps - chosen_ref_logps)
    rejected_rewards = beta * (rejected_logps - rejected_ref_logps)
    return mx.mean(mx.logaddexp(0.0, -(chosen_rewards - rejected_rewards)))


def grpo_loss(model, ref_model, tokens, targets, rewards, group, beta, epsilon):
    """Group-normalised advantages, the clipped surrogate, the k3 KL to the reference."""
    g = rewards.reshape(-1, group)
    adv = (g - g.mean(axis=-1, keepdims=True)) / (mx.std(g, axis=-1, keepdims=True) + 1e-8)
    adv = adv.reshape(-1, 1)
    policy = sequence_log_probs(model(tokens), targets)
    # One update per batch of rollouts: the policy that sampled them is the policy itself.
    old = mx.stop_gradient(policy)
    reference = sequence_log_probs(ref_model(tokens), targets)
    mask = (targets >= 0).astype(mx.float32)
    ratio = mx.exp(policy - old)
    surrogate = mx.minimum(ratio * adv, mx.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    kl = mx.exp(reference - policy) - (reference - policy) - 1
    per_token = surrogate - beta * kl
    per_completion = (per_token * mask).sum(-1) / mx.maximum(mask.sum(-1), 1.0)
    return -per_completion.mean()


def masked_targets(ids, prompt_len):
    """Targets `ids[:, 1:]` with the prompt's (the first prompt_len - 1) ignored."""
    targets = ids[:, 1:]
    column = mx.arange(targets.shape[1])[None, :]
    return mx.where(column >= prompt_len - 1, targets, IGNORE)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("objective", choices=["dpo", "grpo"])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=5632)
    p.add_argument("--batch", type=int, default=4, help="dpo: pairs a step")
    p.add_argument("--seq", type=int, default=512, help="dpo: ids a response row")
    p.add_argument("--prompts", type=int, default=4, help="grpo: prompts an update")
    p.add_argument("--group", type=int, default=8, help="grpo: completions a prompt")
    p.add_argument("--width", type=int, default=256, help="grpo: ids a row")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--beta", type=float, default=None, help="0.1 for dpo, 0.04 for grpo (lmx's)")
    p.add_argument("--epsilon", type=float, default=0.2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    args = p.parse_args()
    mx.set_default_device(getattr(mx, args.device))
    beta = args.beta if args.beta is not None else {"dpo": 0.1, "grpo": 0.04}[args.objective]

    mx.random.seed(0)
    model_args = llama.ModelArgs(
        model_type="llama",
        hidden_size=args.d_model,
        num_hidden_layers=args.layers,
        intermediate_size=args.d_ff,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=args.vocab,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    model = llama.Model(model_args)
    model.set_dtype(getattr(mx, args.dtype))
    ref_model = llama.Model(model_args)
    ref_model.update(model.parameters())
    ref_model.freeze()
    mx.eval(model.parameters(), ref_model.parameters())
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(
        learning_rate=args.lr, betas=[0.9, 0.95], eps=1e-5, weight_decay=0.1
    )
    state = [model.state, optimizer.state]

    if args.objective == "dpo":
        rows, width = 2 * args.batch, args.seq

        def loss_fn(model, chosen, rejected):
            return dpo_loss(
                model,
                ref_model,
                chosen[:, :-1],
                masked_targets(chosen, args.prompt_len),
                rejected[:, :-1],
                masked_targets(rejected, args.prompt_len),
                beta,
            )

        def batch():
            shape = (args.batch, args.seq + 1)
            return mx.random.randint(0, args.vocab, shape), mx.random.randint(0, args.vocab, shape)

    else:
        rows, width = args.prompts * args.group, args.width

        def loss_fn(model, completions, rewards):
            targets = masked_targets(completions, args.prompt_len)
            return grpo_loss(
                model, ref_model, completions[:, :-1], targets, rewards, args.group, beta,
                args.epsilon,
            )

        def batch():
            return (
                mx.random.randint(0, args.vocab, (rows, width + 1)),
                mx.random.uniform(shape=(rows,)),
            )

    # The reference's weights are inputs of the compiled step too, not constants folded into it.
    @partial(mx.compile, inputs=state + [ref_model.state], outputs=state)
    def step(*inputs):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, *inputs)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    times = []
    loss = None
    for i in range(args.warmup + args.steps):
        inputs = batch()
        mx.eval(inputs)
        start = time.perf_counter()
        loss = step(*inputs)
        mx.eval(loss, state)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    print(
        json.dumps(
            {
                "name": f"mlx-{args.objective}",
                "mlx": mx.__version__,
                "params": params,
                "d_model": args.d_model,
                "layers": args.layers,
                "rows": rows,
                "width": width,
                "dtype": args.dtype,
                "steps": len(times),
                "median_ms": round(ms, 2),
                "tokens_per_s": round(rows * width / (ms / 1e3), 1),
                "peak_memory_mib": round(mx.get_peak_memory() / 2**20, 1),
                "last_loss": loss.item(),
            }
        )
    )


if __name__ == "__main__":
    main()
