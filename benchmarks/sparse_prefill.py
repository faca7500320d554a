"""What sparse top-k's prefill attention costs per layer on the CPU, against the dense gate's causal SDPA.

One layer of SmolLM2-135M's geometry (9 query heads in 3 key/value groups, head dim 64), float32, batch 1,
random queries, keys and values, and a random top-k of the 3 groups per query row. Cases:

- `causal SDPA, every row`: what a dense gate (or no gate) runs; the baseline.
- `kept rows in blocks, top-k of 3`: `core/sparse.py`'s `_kept_rows_in_blocks`, the path of prefill without
  gradients: per group and block of rows, the kept rows in two SDPA calls (unmasked over the keys every row
  of the block sees, masked over the rest) merged by their log-sum-exp.
- `kept rows gathered with their mask, top-k of 3`: per group, SDPA over the gathered kept rows with their
  rows of the causal mask; the path of training and padded batches, and of prefill before the blocks.
- `sink 4 + window 64 reads, every row`: `streaming.blocked_streaming_attention`, what the dropped groups
  read with `top_k_sink=4, top_k_window=64`.
- `top-k of 3, sink 4 + window 64: reads, kept rows in blocks merged`: the whole prefill attention of such a
  layer: the reads with their log-sum-exp, then the kept rows over their other keys only, merged.
- `sink 4 + window 64: reads, causal SDPA over every row`: the same layer, whatever its top-k, where the
  blocks do not serve it (and before they did): the reads beside the causal call.
- `SDPA over the reads' blocks, bool mask per group` / `..., additive mask shared by groups`: one SDPA call
  in the layout of those reads (the 3 groups x blocks of 64 rows x 3 heads against 132 keys), with the mask
  as a bool tensor expanded to every group or as one additive tensor broadcast over them (what the reads
  pass since this script was written).

Interleaved rounds after a warm-up (`harness.py`); ratios: case time / causal SDPA of the same round, median
[lowest, highest round].

    python benchmarks/sparse_prefill.py --out benchmarks/results/sparse_prefill

Run it on an otherwise idle machine (about 4 min on 2 cores at the default lengths).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from functools import partial

import torch
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_page,
    markdown_table,
    median_range,
    ratios,
    write_results,
)
from torch.nn import functional as F

from hf_gate_attention.core.sparse import _kept_rows_in_blocks
from hf_gate_attention.core.streaming import blocked_streaming_attention

HEADS, GROUPS, HEAD_DIM = 9, 3, 64
SINK, WINDOW = 4, 64
BASELINE = "causal SDPA, every row"


def attention_inputs(length: int, generator: torch.Generator) -> dict:
    """Query (1, H, L, D), key/value (1, KV, L, D) and, per `k`, the groups each row keeps (1, L, KV)."""
    query = torch.randn(1, HEADS, length, HEAD_DIM, generator=generator)
    key, value = (torch.randn(1, GROUPS, length, HEAD_DIM, generator=generator) for _ in range(2))
    scores = torch.rand(1, length, GROUPS, generator=generator)
    kept = {}  # top-k -> (1, L, KV) bool
    for top_k in (1, 2):
        rows = torch.zeros(1, length, GROUPS, dtype=torch.bool)
        kept[top_k] = rows.scatter(-1, scores.topk(top_k, dim=-1).indices, True)
    return {"query": query, "key": key, "value": value, "kept": kept}


def gathered_with_mask(query, key, value, rows: torch.Tensor) -> torch.Tensor:
    """Per group, SDPA over the kept rows with their rows of the causal mask -> (1, L, H, D)."""
    length, per_group = query.shape[2], HEADS // GROUPS
    out = query.new_zeros(1, length, HEADS, HEAD_DIM)
    for group in range(GROUPS):
        heads = slice(group * per_group, (group + 1) * per_group)
        kept = rows[0, :, group].nonzero().squeeze(1)  # (r,)
        mask = (torch.arange(length) <= kept[:, None])[None, None]  # (1, 1, r, L)
        attended = F.scaled_dot_product_attention(
            query[:, heads, kept], key[:, group : group + 1], value[:, group : group + 1], attn_mask=mask
        )  # (1, n, r, D)
        out[0, kept, heads] = attended[0].transpose(0, 1)
    return out


def block_mask_inputs(length: int, generator: torch.Generator) -> dict:
    """The reads' SDPA layout: rows (KV, nb, c*n, D), keys/values (KV, nb, s + T, D), the mask both ways."""
    block, keys = WINDOW, SINK + 2 * WINDOW
    blocks, per_group = length // block, HEADS // GROUPS
    rows = torch.randn(GROUPS, blocks, block * per_group, HEAD_DIM, generator=generator)
    key, value = (torch.randn(GROUPS, blocks, keys, HEAD_DIM, generator=generator) for _ in range(2))
    valid = torch.rand(1, blocks, block, 1, keys, generator=generator) < 0.5  # one mask row per query row
    valid = valid.expand(-1, -1, -1, per_group, -1).flatten(2, 3)  # (1, nb, c*n, s + T)
    shared = torch.zeros(valid.shape).masked_fill_(~valid, -torch.inf)
    per_group_bool = valid.expand(GROUPS, -1, -1, -1)  # as the reads passed it before: one copy per group
    per_group_bool = per_group_bool.reshape(1, GROUPS * blocks, block * per_group, keys)
    return {"rows": rows, "key": key, "value": value, "shared": shared, "bool": per_group_bool}


def cases_at(length: int, generator: torch.Generator) -> dict:
    """Case name -> a function running it once on fresh-per-length inputs."""
    a = attention_inputs(length, generator)
    q, k, v, kept = a["query"], a["key"], a["value"], a["kept"]
    b = block_mask_inputs(length, generator)
    flat = {name: b[name].flatten(0, 1)[None] for name in ("rows", "key", "value")}  # (1, KV*nb, ., D)
    causal = partial(F.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=True)
    reads = partial(blocked_streaming_attention, q, k, v, None, True, SINK, WINDOW)
    cases = {BASELINE: causal}
    in_blocks = [[True] * GROUPS]
    for top_k in (2, 1):
        cases[f"kept rows in blocks, top-{top_k} of 3"] = partial(
            _kept_rows_in_blocks, q, k, v, kept[top_k], None, in_blocks
        )
        cases[f"kept rows gathered with their mask, top-{top_k} of 3"] = partial(
            gathered_with_mask, q, k, v, kept[top_k]
        )
    cases[f"sink {SINK} + window {WINDOW} reads, every row"] = reads

    def reads_and_kept_rows(top_k: int):
        attended, lse = reads(lse=True)  # (1, H, L, D), (1, H, L)
        read_keys = (attended.transpose(1, 2), lse.transpose(1, 2), SINK, WINDOW)
        return _kept_rows_in_blocks(q, k, v, kept[top_k], None, in_blocks, read_keys)

    for top_k in (2, 1):
        streaming = f"top-{top_k} of 3, sink {SINK} + window {WINDOW}"
        cases[f"{streaming}: reads, kept rows in blocks merged"] = partial(reads_and_kept_rows, top_k)
    cases[f"sink {SINK} + window {WINDOW}: reads, causal SDPA over every row"] = lambda: (reads(), causal())
    cases["SDPA over the reads' blocks, bool mask per group"] = lambda: F.scaled_dot_product_attention(
        flat["rows"], flat["key"], flat["value"], attn_mask=b["bool"]
    )
    cases["SDPA over the reads' blocks, additive mask shared by groups"] = lambda: (
        F.scaled_dot_product_attention(b["rows"], b["key"], b["value"], attn_mask=b["shared"])
    )
    return cases


@torch.no_grad()
def measure(length: int, rounds: int, generator: torch.Generator) -> list[dict]:
    cases = cases_at(length, generator)

    def run(case: str) -> float:
        start = time.perf_counter()
        cases[case]()
        return time.perf_counter() - start

    times = interleaved(run, list(cases), rounds)
    rows = []
    for case, seconds in times.items():
        ratio, low, high = median_range(ratios(seconds, times[BASELINE]))
        rows.append(
            {
                "length": length,
                "case": case,
                "ms": 1000 * statistics.median(seconds),
                "ratio": ratio,
                "ratio_low": low,
                "ratio_high": high,
                "rounds": len(seconds),
            }
        )
        print(
            f"{length:>6} {case}: {rows[-1]['ms']:.1f} ms, x{ratio:.3f} [{low:.3f}, {high:.3f}]", flush=True
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per length, after a warm-up")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--out", default="benchmarks/results/sparse_prefill", help="writes <out>.csv/.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = [row for length in args.lengths for row in measure(length, args.rounds, generator)]
    header = (
        f"`{command_line()}` on {datetime.date.today()}: one attention layer of SmolLM2-135M's geometry "
        f"({HEADS} heads, {GROUPS} key/value groups, head dim {HEAD_DIM}), float32, batch 1, no gradients; "
        f"{args.rounds} interleaved rounds after a warm-up; {cpu_model()}, {args.threads} threads; torch "
        f"{torch.__version__}. Ratio: case time / causal SDPA over every row of the same round, median "
        "[lowest, highest round]; below 1 is faster."
    )
    cells = [
        [
            f"{r['length']:,}",
            r["case"],
            f"{r['ms']:.1f}",
            f"x{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]",
        ]
        for r in rows
    ]
    table = markdown_table(["keys", "case", "ms", "ratio [rounds]"], cells, "rlrl")
    write_results(args.out, rows, markdown_page(header, table))


if __name__ == "__main__":
    main()
