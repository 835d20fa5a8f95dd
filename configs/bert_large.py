"""BERT-large pretraining as in Devlin et al. 2019 (arXiv:1810.04805), Appendix A.2.

    bert-jax pretrain --config=configs/bert_large.py:phase1 --workdir=gs://bucket/bert_large/phase1 \
        --config.data.train_files=gs://bucket/prepared/train --config.data.vocab_file=gs://bucket/vocab.txt
    bert-jax pretrain --config=configs/bert_large.py:phase2 --workdir=gs://bucket/bert_large/phase2 \
        --config.init_from=gs://bucket/bert_large/phase1/checkpoints ...
    bert-jax aot --config=configs/bert_large.py:phase2 --topology=v3:8x8   # check it fits first

Same recipe as `bert_base.py` (see there: 1M steps, 90% at seq 128 then 10% at 512, batches of 256
sequences, or 1024 at seq 128 with `:phase1_tokens`, lr 1e-4, 10k warmup, linear decay); only the model
and the hardware differ: BERT-large was trained on "16 Cloud TPUs (64 TPU chips total)" (A.2), hence
`topology = "v3:8x8"`.

The meshes (data x fsdp x tensor over v3:8x8's 128 cores) are those `bert-jax aot --search_mesh` ranked
first (docs/performance.md): phase 1 1 x 64 x 2 among 32x4x1 (the earlier choice), 8x16x1, 2x64x1,
1x128x1 and 1x64x2; phase 2 2 x 64 x 1 among 32x4x1, 2x64x1 and 1x64x2 (scanned), and again among
2x64x1, 4x32x1, 1x64x2 and 1x128x1 unrolled with bfloat16 scores; `phase1_tokens` 2 x 64 x 1 among
1x64x2, 2x64x1, 1x128x1 and 2x32x2 (unrolled). With 2 sequences per core the bytes of parameters and
Adam moments dominate the step: sharding them 64 ways (fsdp), and at seq 128 each matrix 2 ways too
(tensor; BERT's 30,522-word vocabulary allows no more), moves the fewest; with 8 (`phase1_tokens`) the
tensor split costs more than it saves. On v3 each weight is gathered once a step and kept for the backward
pass (`model.reshard_after_forward` False, from bert_base.py: phase 1 61% -> 66%); v5e and v6e gather it in
each pass, which XLA's count puts ahead there.

On the chips rented today, name the topology after the phase and the config takes that search's first
mesh, the remat policy that compiled to fewer bytes there (where both were compiled), the topology and
its chip's peak (for MFU):

    bert-jax aot --config=configs/bert_large.py:phase1,v5e:8x8
    bert-jax pretrain --config=configs/bert_large.py:phase2,v6e:8x8 --workdir=...

`MESHES` lists the searched ones; another topology stops with the command that searches it. Attention
stays on the explicit path; `--config.model.attention_kernel=flash` runs it, dropout included, as one
Pallas kernel: `aot` estimates it faster on v3, and its compiled schedule puts the kernel's own cost well
above that estimate (docs/performance.md).
"""

from bert_jax import tpu_chips
from configs import bert_base

# (topology, phase) -> ((data, fsdp, tensor), model settings): `bert-jax aot --search_mesh`'s first for each
# topology (docs/performance.md: v3:8x8's phase 1 searched scanned under "Choosing the mesh", its phase 2
# and phase1_tokens unrolled there too; v5e:8x8 and v6e:8x8 unrolled under "Where the targets stand");
# data -1 takes what is left of the devices. remat "minimal" against "none", unrolled: none wins for v3
# phase 2, minimal for v5e's and v6e's phase 1 and phase1_tokens (at 2 x 32 x 1). v3's phase 1 keeps "none"
# (unrolled 66%, "minimal" 54%, each weight gathered once);
# v3's phase1_tokens and phase 2 on v5e and v6e keep "none", "minimal" not compiled. "full" (each layer's
# forward pass again in the backward pass, only its input saved) moves fewer bytes by XLA's count on v5e's
# phase 1 (13.23 -> 12.4 GB, MFU bound 30.2% -> 32%) and phase1_tokens (30.08 -> 24.35 GB, 53.2% -> 66%),
# and on v6e's phase 1 (15.16 -> 13.73 GB, 11.5% -> 12.5%), though XLA counts about 1.3 times the FLOPs;
# more on v5e's phase 2 (36.99 -> 39.3 GB, 45.9% -> 43%) and v6e's phase1_tokens (41.98 -> 43.8 GB, 16.4% ->
# 16%), which keep theirs. With on-chip traffic free the order turns (phase1_tokens 95% -> 73%, bound by the
# recomputed FLOPs): on a TPU, time "minimal" too (docs/performance.md).
# reshard_after_forward: bert_base.py's False (each weight gathered once a step) on v3, where it moves fewer
# bytes (phase 1 MFU bound 61% -> 66%); on v5e and v6e the gathers again in the backward pass cost fewer by
# XLA's count (v5e phase 1 23% against 16%, phase1_tokens 49% against 35%, phase 2 42% against 30%; v6e
# phase 1 10% against 8%, phase1_tokens 16% against 15%, phase 2 13% against 11%).
# embedding_lookup_on_shards: the word-embedding lookup on each chip's shard of the table (no table-sized
# gradient; models/embedding_lookup.py) where a full compile put it ahead: v5e phase 1 17.38 -> 17.11 GB,
# MFU bound 23.0% -> 23.4%; phase 2 40.43 -> 40.19 GB, 42.0% -> 42.2%. On v3 (16 columns a shard at fsdp 64,
# padded to 128 lanes) XLA counts more; v5e's phase1_tokens takes it with decoder_on_shards (below); v6e's
# phase1_tokens and phase 2 move more with both (4 layers: phase 2 9.62 -> 9.98 GB); v6e's phase 1 was not
# compiled with it.
# constrain_attention_matrices: left on (the default) but for v5e's phase 2, where XLA's count is lower
# without it (4 layers: 9.3 -> 7.4 GB, MFU bound 33% -> 41%; v6e's phase 2 the other way, 9.5 against
# 10.4 GB; phase 1 on v5e 3.66 -> 3.41 GB with it; docs/performance.md). phase1_tokens not compiled both ways.
# fused_qkv: one query-key-value matmul on v3's phase 1, whose tensor split all-reduces x's gradient once
# instead of three times (24 layers, the kernels stacked: 4.19 GB a core, MFU bound 84.0%), and on v5e's
# phase 1 for the same reason since it splits over tensor too (below). Without a tensor split XLA counts more
# bytes with it on v5e (4 layers: phase 1 2.995 -> 3.010 GB, phase 2 7.35 -> 8.86 GB); v3's phase 2
# and phase1_tokens are compute-bound either way (96.1% and 100%, 13.68 -> 13.59 and 13.15 -> 13.06 GB),
# and phase1_tokens compiled slower with it (23.1 against 32.5 s), so those leave it off (docs/performance.md).
# dropout_bits "hash" on v3: a counter hash of each element's index for the dropout masks in place of
# threefry's (models/dropout.py). XLA's bytes are the same (phase 1 4.592 -> 4.598 GB, MFU bound 77% both)
# and the compile is shorter (phase 1 82.0 -> 57.4 s on a 2-core CPU); phase 2 13.9 GB, compute-bound,
# MFU bound 96% against threefry's 91% (XLA counts the hash's integer ops as FLOPs: 2.12 against 2.24
# TFLOP a core); phase1_tokens 10.95 GB, 98% (10.94 GB, 96%). Pretraining configs/tiny.py with dropout 0.1
# for 2,000 steps, two seeds each, the held-out MLM loss was 5.297 and 5.136 with the hash, 5.091 and 5.370
# with threefry (docs/performance.md).
# recompute_gelu: off. With the exact GELU it took v3's phase 1 from 4.444 to 4.394 GB (the forward pass no
# longer wrote the erfc term three backward fusions read); with bert_base.py's tanh GELU, which XLA fuses
# into the output matmul, recomputing it moves more (2 layers: 0.509 GB without, 0.517 GB with).
# layer_norm_kernel "pallas" on v3's phase 1: the layers' LayerNorm backward passes as one Pallas kernel
# each, which reads the two gradients of a norm's output apart (models/layer_norm_kernel.py; 24 layers:
# 3.961 -> 3.833 GB a core by XLA's count, MFU bound 88.9% -> 91.9%). On v5e it adds bytes by XLA's count
# (phase 1 14.31 -> 14.40 GB, phase 2 36.99 -> 37.81, phase1_tokens 31.68 -> 32.10), so v5e and v6e keep XLA's.
# scan_layers on v3's phase1_tokens: compute-bound either way (compute 31.3 to 31.9 ms), so one compiled
# layer body costs no step time by the estimate: memory 29.2 ms (13.2 GB by op) scanned against 23.8 ms
# (10.7 GB) unrolled, compiled in 18.6 s against 78.6 s on a 2-core CPU (docs/performance.md). Phase 1
# and phase 2 are memory-bound scanned (65% and 85% against 80% and 96%), so they have no loop, as do
# v5e's and v6e's memory-bound steps: unrolled, or unrolled over stacked params (`_STACKED` below: v3's phase 1
# and phase 2, v5e's phase 1 and phase1_tokens, v6e's phase1_tokens); bert_base.py scans its own
# phase1_tokens; here each entry says.
# v5e's phase 1 at 2 x 16 x 2: a search of the tensor splits unrolled (4 layers: 2x16x2 2.79 GB, 4x8x2 2.89,
# 2x32x1 2.97, 8x4x2 3.91), then the whole step (24 layers, XLA's count): 2 x 32 x 1 as shipped before 14.31
# GB, MFU bound 27.96%; 2 x 16 x 2 14.54 GB, 27.52%; with fused_qkv 13.98 GB, 28.63%. The tensor split lost
# with 4 times the tokens (v5e's phase1_tokens 45% -> 35%, phase 2 43% -> 36%, 4 layers) and on v6e's phase 1
# (10% -> 9%), which keep theirs (docs/performance.md).
# decoder_on_shards on v3's phase 1: the MLM decoder and its cross-entropy on each core's slice of the
# vocabulary, no gathered table (models/vocab_split.py; 24 layers: 4.394 -> 4.282 GB a core, MFU bound
# 80.2% -> 82.2%), on v5e's (14.58 -> 14.41 GB, 27.5% -> 27.8%) and on v6e's (15.59 -> 15.16 GB, 11.0% ->
# 11.3%; HBM bytes 3.48 -> 2.41 GB, the bound with on-chip traffic free 49% -> 71%). The compute-bound v3
# steps and the other v5e and v6e steps were not compiled with it. On v3's tensor split the masked rows are
# split over tensor too (4.191 -> 4.175 GB, 84.0% -> 84.3%). v5e's phase1_tokens with it and
# embedding_lookup_on_shards (24 layers: 31.68 -> 31.14 GB, MFU bound 50.5% -> 51.4%; 4 layers 7.0 GB, 6.5
# with the decoder's alone, 6.7 with the lookup's alone, 6.4 with both); v6e's phase1_tokens moves more
# with both (4 layers: 8.59 -> 9.39 GB, 14.4% -> 13.2%) and keeps neither; so does v5e's phase 2 keep its
# decoder whole (24 layers: 36.99 -> 37.21 GB, 45.9% -> 45.6%, though 4 layers went 7.05 -> 6.91 GB).
_V3 = {"remat_policy": "none", "dropout_bits": "hash", "scan_layers": False}
_LITE = {"reshard_after_forward": True, "scan_layers": False, "dropout_bits": "threefry"}
# The layers unrolled over their stacked params (`scan_unroll` num_layers: one layer traced, no loop): v3's
# phase 1 compiles in 29.1 to 29.7 s on a 2-core CPU against 48.8 s, at MFU bound 91.9% against 92.3%
# (3.832 against 3.816 GB a core); its phase 2, compute-bound either way (96.3%), in 55.3 s against 67.1 s,
# and it starts from phase 1's checkpoint in the same layout. Where XLA counted fewer bytes so: v5e's phase 1
# 13.98 -> 13.23 GB, MFU bound 28.6% -> 30.2%, phase1_tokens 31.14 -> 30.08 GB, 51.4% -> 53.2% (compiled in
# 119 and 149 s here beside other work, against 195 to 524 s unrolled on earlier days), and v6e's
# phase1_tokens 14.8% -> 16.4% (41.98 GB). v5e's phase 2 43.5% against 45.9%, v6e's phase 1 11.0% against
# 11.5% and phase 2 14.8% against 15.2% stay unrolled (docs/performance.md).
_STACKED = {"scan_layers": True, "scan_unroll": 24}
MESHES = {
    ("v3:8x8", "phase1"): ((-1, 64, 2), _V3 | _STACKED | {"fused_qkv": True, "decoder_on_shards": True,
                                                            "layer_norm_kernel": "pallas"}),
    ("v3:8x8", "phase1_tokens"): ((-1, 64, 1), _V3 | {"scan_layers": True}),
    ("v3:8x8", "phase2"): ((-1, 64, 1), _V3 | _STACKED),
    ("v5e:8x8", "phase1"): ((-1, 16, 2), _LITE | _STACKED | {"remat_policy": "full", "fused_qkv": True,
                                                              "embedding_lookup_on_shards": True,
                                                              "decoder_on_shards": True}),
    ("v5e:8x8", "phase1_tokens"): ((-1, 32, 1), _LITE | _STACKED | {"remat_policy": "full",
                                                                     "decoder_on_shards": True,
                                                                     "embedding_lookup_on_shards": True}),
    ("v5e:8x8", "phase2"): ((-1, 32, 1), _LITE | {"remat_policy": "none", "embedding_lookup_on_shards": True,
                                                   "constrain_attention_matrices": False}),
    ("v6e:8x8", "phase1"): ((-1, 32, 1), _LITE | {"remat_policy": "full", "decoder_on_shards": True}),
    ("v6e:8x8", "phase1_tokens"): ((-1, 64, 1), _LITE | _STACKED | {"remat_policy": "minimal"}),
    ("v6e:8x8", "phase2"): ((-1, 32, 1), _LITE | {"remat_policy": "none"}),
}
PAPER_TOPOLOGY = "v3:8x8"   # "16 Cloud TPUs (64 TPU chips total)" (A.2)
# The dropout keys' implementation (`dropout_rng`) where it is not the default: the hash keys beside the hash
# bits on v3 (models/dropout_key.py; phase 1 3.833 -> 3.816 GB a core, MFU bound 91.9% -> 92.3%, compiled in
# 50.5 -> 48.8 s on a 2-core CPU; docs/performance.md).
DROPOUT_RNGS = {"v3:8x8": "hash"}


def get_config(arg: str = "phase1"):
  """`arg` is "phase1" (256 x 128), "phase1_tokens" (1024 x 128) or "phase2" (256 x 512), as in bert_base,
  optionally followed by a topology of `MESHES` ("phase1,v5e:8x8"; default the paper's v3:8x8)."""
  phase, _, topology = arg.partition(",")
  topology = topology or PAPER_TOPOLOGY
  c = bert_base.get_config(phase, preset="large")   # checks the phase
  if (topology, phase) not in MESHES:
    searched = sorted({t for t, _ in MESHES})
    raise ValueError(f"no searched mesh for {topology!r}: use one of {searched}, or search one with "
                     f"`bert-jax aot --config=configs/bert_large.py:{phase} --topology={topology} --search_mesh` "
                     f"and add it to MESHES in configs/bert_large.py (or run `:{phase}` with "
                     f"--config.topology={topology}, --config.peak_flops_per_device and --config.mesh.*)")
  c.topology = topology
  c.peak_flops_per_device = tpu_chips.peak_flops_per_device(topology)
  (c.mesh.data, c.mesh.fsdp, c.mesh.tensor), model = MESHES[topology, phase]
  c.model.update(model)
  c.dropout_rng = DROPOUT_RNGS.get(topology, c.dropout_rng)
  return c
