"""Where config 7's warps stall, from Nsight Compute's source page (``ws_stalls.sh``): for each
``src_SHAPE.csv(.gz)`` given, the warp-state samples by stall reason, the samples and the executed
instructions of the producer (the SASS between its first and last ``LDGSTS``) against the rest, and
the instructions with the most samples.

    python kernels/bench/ws_stalls.py kernels/results/ws-variants/h100-stalls-*.csv.gz
"""
import collections
import csv
import gzip
import sys


def num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summary(path: str, top: int = 25) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    hdr = rows[hi]
    data = [r for r in rows[hi + 1:] if len(r) == len(hdr)]
    src, samples = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
    executed = hdr.index("Instructions Executed")
    reasons = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "Not Issued" not in c]
    ops = [r[src].strip() for r in data]
    total = sum(num(r[samples]) for r in data)
    inst = sum(num(r[executed]) for r in data)
    print(f"== {path}: {total:.0f} samples, {inst / 1e6:.1f} M warp instructions executed")
    by = collections.Counter()
    for r in data:
        for i in reasons:
            by[hdr[i][6:]] += num(r[i])
    print("by reason (% of samples):", ", ".join(f"{k} {v / total:.1%}" for k, v in by.most_common(10)))
    copies = [i for i, o in enumerate(ops) if "LDGSTS" in o]
    lo, hi_ = copies[0], copies[-1]
    p_samples = sum(num(r[samples]) for r in data[lo:hi_ + 1])
    p_inst = sum(num(r[executed]) for r in data[lo:hi_ + 1])
    print(f"producer's copy code (SASS rows {lo}-{hi_}): {p_samples / total:.1%} of samples, "
          f"{p_inst / inst:.1%} of instructions")
    for j in sorted(range(len(data)), key=lambda j: -num(data[j][samples]))[:top]:
        r = data[j]
        lead = sorted(((num(r[i]), hdr[i][6:]) for i in reasons if num(r[i]) > 0), reverse=True)[:2]
        print(f"{j:5d} {num(r[samples]) / total:6.2%} {num(r[executed]) / 1e6:6.2f} M  {ops[j][:64]:64s} "
              + ", ".join(f"{n} {v:.0f}" for v, n in lead))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summary(p)
