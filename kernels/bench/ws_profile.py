"""One prefill shape run four times, for a profiler (ws_profile.sh): ``ws SHAPE l2|l3 CONFIG`` the
paged kernel, ``cudnn SHAPE l2|l3`` cuDNN's SDPA on contiguous K/V; SHAPE is batch,cached,new and
l2 / l3 llama-2-7b's (32 / 32) or llama-3-8b's (32 / 8) heads."""
import sys
import torch
sys.path.insert(0, ".")
from kernels.bench.prefill import PrefillCase, causal_sdpa
shape = tuple(int(x) for x in sys.argv[2].split(","))
heads, kvh = (32, 32) if sys.argv[3] == "l2" else (32, 8)
c = PrefillCase(*shape, heads, kvh)
if sys.argv[1] == "ws":
    for _ in range(4):
        c.paged(config=int(sys.argv[4]))
else:
    from torch.nn.attention import SDPBackend
    q = c.sdpa_query()
    k, v = c.contiguous()
    for _ in range(4):
        causal_sdpa(q, k, v, c.cached, SDPBackend.CUDNN_ATTENTION)
torch.cuda.synchronize()
