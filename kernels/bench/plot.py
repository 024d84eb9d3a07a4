"""The sweep's plot: effective KV bandwidth against context, one panel per batch size."""

from __future__ import annotations


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["sweep"]
    batches = sorted({r["shape"][0] for r in rows})
    impls = (("fast", "fast (impl='fast')", "-"), ("vllm", "vLLM layout v1/v2 (auto)", ":"),
             ("sdpa", "SDPA, contiguous K/V", "--"), ("gather_sdpa", "gather + SDPA", "-."))
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 4), sharey=True)
    for ax, b in zip(axes, batches):
        pts = sorted((r for r in rows if r["shape"][0] == b), key=lambda r: r["shape"][3])
        ctx = [r["shape"][3] for r in pts]
        for key, label, style in impls:
            ms = [r["v1"] if key == "vllm" and r["auto"] == "v1" else r["v2"] if key == "vllm" else r[key]
                  for r in pts]
            ax.plot(ctx, [r["kv_bytes"] / (t * 1e-3) / 1e9 for r, t in zip(pts, ms)], style, marker="o", label=label)
        ax.axhline(rows[0]["copy_gbs"], color="grey", lw=0.8, label="copy bandwidth (read + write)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {b}")
        ax.set_xlabel("context (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("effective KV bandwidth (GB/s)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Decode attention, 32 heads / 8 KV heads, head 128, float16, block 16 ({results['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
