"""loss.png from warm_start.json's loss curve: python plot_loss.py (in this folder)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

r = json.load(open("warm_start.json"))
L = r["sft"]["losses"]
k = 15
avg = [sum(L[max(0, i - k + 1):i + 1]) / len(L[max(0, i - k + 1):i + 1]) for i in range(len(L))]
fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=120)
ax.plot(range(1, len(L) + 1), L, lw=0.6, alpha=0.4, label="step")
ax.plot(range(1, len(L) + 1), avg, lw=1.6, label=f"mean of the last {k} steps")
ax.set_yscale("log")
ax.set_xlabel("SFT step (8 conversations)")
ax.set_ylabel("loss (nats / target token)")
ax.set_title(f"SmolLM2-135M warm start {r['key']}: LoRA r16, lr 3e-4, bfloat16 autocast", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("loss.png")
