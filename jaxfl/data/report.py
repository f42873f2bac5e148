"""What a split looks like: per-client sample counts and class histograms, as a table and a heatmap.

``jaxfl partition --dataset ... --partition ... --clients ...`` prints :meth:`PartitionReport.table`
and saves :func:`plot_class_heatmap`'s PNG (matplotlib, imported only when plotting).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxfl.data.federated import FederatedData

__all__ = ["PartitionReport", "partition_report", "plot_class_heatmap"]


@dataclasses.dataclass(frozen=True)
class PartitionReport:
    """Counts per client and class, plus summary statistics of a partition.

    Example:
        >>> import numpy as np
        >>> rep = PartitionReport(np.array([[3, 0], [1, 2]]))
        >>> rep.counts.tolist(), rep.classes_per_client.tolist()
        ([3, 3], [1, 2])
    """

    histogram: np.ndarray  # (C, K) samples of class k held by client c
    title: str = ""

    @property
    def counts(self) -> np.ndarray:
        """``(C,)`` samples per client.

        Example:
            >>> PartitionReport(np.array([[1, 2]])).counts.tolist()
            [3]
        """
        return self.histogram.sum(axis=1)

    @property
    def classes_per_client(self) -> np.ndarray:
        """``(C,)`` number of distinct classes each client holds.

        Example:
            >>> PartitionReport(np.array([[1, 0], [1, 1]])).classes_per_client.tolist()
            [1, 2]
        """
        return (self.histogram > 0).sum(axis=1)

    def summary(self) -> dict:
        """Totals and spread: clients, samples, min/median/max client size, classes per client.

        Example:
            >>> PartitionReport(np.array([[3, 0], [1, 2]])).summary()["samples"]
            6
        """
        counts, classes = self.counts, self.classes_per_client
        # Earth mover's-free skew measure: mean total-variation distance of a client's label mix
        # from the global mix (0 = IID, 1 = disjoint labels).
        mix = self.histogram / np.maximum(counts[:, None], 1)
        overall = self.histogram.sum(axis=0) / max(int(counts.sum()), 1)
        return {
            "clients": int(len(counts)),
            "classes": int(self.histogram.shape[1]),
            "samples": int(counts.sum()),
            "min": int(counts.min()),
            "median": float(np.median(counts)),
            "max": int(counts.max()),
            "mean_classes_per_client": float(classes.mean()),
            "label_skew_tv": float(0.5 * np.abs(mix - overall).sum(axis=1).mean()),
        }

    def table(self, max_rows: int = 40) -> str:
        """A text table: one row per client (first and last ``max_rows / 2`` if there are more).

        Example:
            >>> print(PartitionReport(np.array([[3, 0], [1, 2]])).table())  # doctest: +NORMALIZE_WHITESPACE
            client samples classes | 0 1
            0 3 1 | 3 0
            1 3 2 | 1 2
            2 clients, 6 samples; per client min 3, median 3, max 3; 1.50 classes per client; label skew (TV) 0.333
        """
        if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)) or max_rows < 1:
            raise ValueError(f"max_rows={max_rows!r} is not allowed: an integer >= 1 (client rows shown)")
        num_clients, num_classes = self.histogram.shape
        head = f"{'client':>7} {'samples':>8} {'classes':>7} | " + " ".join(f"{k:>5}" for k in range(num_classes))
        rows = [head] if not self.title else [self.title, head]
        # Only the shown rows are listed, and the per-client columns computed once: with 10^6
        # clients a list of every client id, or a histogram sum per printed row, costs seconds.
        half = max_rows // 2  # the last ones; the first max_rows - half (an odd count shows one more first)
        shown = list(range(num_clients)) if num_clients <= max_rows else \
            list(range(max_rows - half)) + [None] + list(range(num_clients - half, num_clients))
        counts, classes = self.counts, self.classes_per_client
        for c in shown:
            if c is None:
                rows.append(f"{'...':>7}")
                continue
            cells = " ".join(f"{v:>5}" for v in self.histogram[c])
            rows.append(f"{c:>7} {counts[c]:>8} {classes[c]:>7} | {cells}")
        s = self.summary()
        rows.append(f"{s['clients']} clients, {s['samples']} samples; per client min {s['min']}, median "
                    f"{s['median']:g}, max {s['max']}; {s['mean_classes_per_client']:.2f} classes per client; "
                    f"label skew (TV) {s['label_skew_tv']:.3f}")
        return "\n".join(rows)


def partition_report(federation: FederatedData, title: str = "") -> PartitionReport:
    """The :class:`PartitionReport` of a federation.

    Example:
        >>> from jaxfl.data import build_federation, load_dataset
        >>> rep = partition_report(build_federation(load_dataset("mnist10k"), 4))
        >>> rep.summary()["samples"]
        8000
    """
    return PartitionReport(federation.class_histogram(), title)


def plot_class_heatmap(report: PartitionReport, path: str | os.PathLike, max_clients: int = 1000) -> str:
    """Save a heatmap of class counts per client (rows: clients, columns: classes) to ``path``,
    written atomically in the format its suffix names: ``.png`` (:func:`jaxfl.plot.save_figure`), or
    another that matplotlib writes (``.pdf``, ``.svg``, ...: :func:`figure_formats`).

    With more than ``max_clients`` clients, an evenly spaced subset of rows is drawn (the title
    says so; the axis keeps the clients' ids). The default draws every row on a pixel of its own at
    the figure's largest height. The figure is 6.5 to 20 inches wide (many classes share the width).
    Returns the path.

    Example:
        >>> plot_class_heatmap(partition_report(fd), "/tmp/split.png")  # doctest: +SKIP
        '/tmp/split.png'
    """
    import textwrap

    # A bare Figure renders with Agg without touching pyplot's global backend (notebooks keep theirs).
    from matplotlib.figure import Figure

    from jaxfl.plot import save_figure

    path = os.fspath(path)
    suffix, formats = os.path.splitext(path)[1].lower().lstrip("."), figure_formats()
    if suffix not in formats:  # none: matplotlib added .png to the file, and the path returned lacked it
        raise ValueError(f"path={path!r} is not allowed: a file name ending in one of "
                         f"{', '.join('.' + name for name in formats)} (the figure's format)")
    hist = report.histogram
    rows = np.arange(len(hist))
    if len(hist) > max_clients:
        rows = np.unique(np.linspace(0, len(hist) - 1, max_clients).astype(np.int64))
    height = min(12.0, 2.0 + 0.25 * len(rows))
    width = min(20.0, max(6.5, 1.2 + 0.5 * hist.shape[1]))  # 1,000 classes drew a 50,000-pixel-wide figure
    fig = Figure(figsize=(width, height))
    ax = fig.subplots()
    # the rows drawn at their clients' ids: a subset's rows were labelled with their places in it
    extent = (-0.5, hist.shape[1] - 0.5, rows[-1] + 0.5, rows[0] - 0.5) if len(rows) else None
    image = ax.imshow(hist[rows], aspect="auto", interpolation="nearest", cmap="viridis", extent=extent)
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if len(rows) <= 40:
        ax.set_yticks(rows, [str(r) for r in rows])
    if hist.shape[1] <= 20:
        ax.set_xticks(range(hist.shape[1]))
    subset = f" ({len(rows)} of {len(hist)} clients shown)" if len(rows) < len(hist) else ""
    # wrapped to the figure's width: a Dirichlet split's title ran off both sides
    ax.set_title(textwrap.fill((report.title or "class counts per client") + subset, width=int(width * 8)))
    fig.tight_layout()
    if suffix == "png":
        return save_figure(fig, path, dpi=100)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {path!r}: its folder {folder!r} does not exist")
    from jaxfl.runlog import written_atomically

    with written_atomically(path) as temporary:  # whole or not at all, as save_figure writes
        fig.savefig(temporary, dpi=100, format=suffix)
    return path


def figure_formats() -> tuple[str, ...]:
    """The file suffixes (without the dot) that matplotlib writes a figure as.

    >>> {"png", "pdf", "svg"} <= set(figure_formats())
    True
    """
    from matplotlib.figure import Figure

    # pgf needs a LaTeX installation to write
    return tuple(sorted(set(Figure().canvas.get_supported_filetypes()) - {"pgf"}))
