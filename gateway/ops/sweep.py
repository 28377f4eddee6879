"""``route explain --prompt-tokens 1000,8000,32000``: each backend's predictions across prompt lengths,
as a table and as a plot (matplotlib, the ``sim`` extra)."""

from __future__ import annotations

from pathlib import Path

from routing.decisions import Decision
from routing.types import FleetSnapshot, RequestFeatures

Runs = list[tuple[RequestFeatures, Decision]]


def _serving(runs: Runs, snapshot: FleetSnapshot) -> list[str]:
    model = runs[0][0].model
    return [b.name for b in snapshot.backends if model in b.profile.models]


def table(runs: Runs, snapshot: FleetSnapshot) -> str:
    """One row per backend serving the model, one column per prompt length: predicted TTFT / e2e in ms,
    ``*`` on the one chosen, or why it was excluded; then the decision at each length."""
    f0 = runs[0][0]
    head = ["backend", *(f"{f.prompt_tokens} tok: ttft / e2e ms" for f, _ in runs)]
    rows = [head]
    for name in _serving(runs, snapshot):
        row = [name]
        for _, d in runs:
            c = next((c for c in d.candidates if c.backend == name), None)
            if c is not None:
                chosen = "*" if d.candidates and d.candidates[0].backend == name else " "
                row.append(f"{c.prediction.ttft_ms:.0f} / {c.prediction.e2e_ms:.0f}{chosen}")
            else:
                row.append(f"excluded: {d.excluded.get(name, '?')}")
        rows.append(row)
    rows.append(["decision", *(d.reason.value for _, d in runs)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        f"model {f0.model}, {f0.max_tokens if f0.max_tokens is not None else 'default'} max tokens; "
        "predicted on an idle fleet (* chosen)",
        "",
    ]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def plot(runs: Runs, snapshot: FleetSnapshot, path: Path, title: str) -> None:
    """Predicted TTFT against prompt length, one line per backend (gaps where it was excluded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    styles = ("-", "--", ":", "-.")
    for i, name in enumerate(_serving(runs, snapshot)):
        points = [(f.prompt_tokens, c.prediction.ttft_ms) for f, d in runs for c in d.candidates if c.backend == name]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", linestyle=styles[i // 10 % len(styles)], label=name)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("predicted time to first token (ms, idle fleet)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
