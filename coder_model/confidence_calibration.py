"""Calibrated confidence: a monotone map from the sampler's raw score to P(correct).

The sampler scores an answer from its committed slots' probabilities
(`sampler.CONFIDENCE_KINDS`). Raw scores rank answers but are not
probabilities (a model trained on little data is over- or under-confident),
so `evaluation.calibrate` fits an isotonic (monotone, non-decreasing) map on
held-out examples and stores it as `calibration.json` next to the checkpoint,
together with the score kind that ranked correct answers best. The server's
confidence gate (lsp.gate) then compares calibrated values with thresholds
that mean the same thing for every checkpoint.

No calibration file: the identity map on the default kind. Nothing here imports
torch.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FILE_NAME = "calibration.json"
FORMAT = "dlm-calibration"
VERSION = 1
# The raw score kind used without a calibration file. `evaluation.calibrate` measures
# which kind ranks correct answers best for a checkpoint and stores its choice.
DEFAULT_KIND = "geo_mean"
KINDS = ("geo_mean", "min", "product")  # = sampler.CONFIDENCE_KINDS (kept here: no torch import)


class CalibrationError(ValueError):
    """A calibration.json that cannot be used."""


@dataclass(frozen=True)
class Calibration:
    """Piecewise-linear, non-decreasing map through the points (xs[i], ys[i]); clamped outside.

    Empty xs: the identity. `kind` names the raw score it applies to.
    """

    kind: str = DEFAULT_KIND
    xs: tuple[float, ...] = ()
    ys: tuple[float, ...] = ()
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CalibrationError(f"confidence kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if len(self.xs) != len(self.ys):
            raise CalibrationError(f"{len(self.xs)} x values but {len(self.ys)} y values; the map needs pairs")
        for name, vals in (("x", self.xs), ("y", self.ys)):
            if any(not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1 for v in vals):
                raise CalibrationError(f"{name} values must be numbers in [0, 1], got {list(vals)}")
        if any(b < a for a, b in zip(self.xs, self.xs[1:])) or any(b < a for a, b in zip(self.ys, self.ys[1:])):
            raise CalibrationError("x and y values must be non-decreasing (the map is monotone)")

    @classmethod
    def identity(cls, kind: str = DEFAULT_KIND) -> Calibration:
        return cls(kind=kind)

    @property
    def is_identity(self) -> bool:
        return not self.xs

    def __call__(self, raw: float) -> float:
        raw = min(max(float(raw), 0.0), 1.0)
        xs, ys = self.xs, self.ys
        if not xs:
            return raw
        if raw <= xs[0]:
            return ys[0]
        if raw >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, raw)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 if x1 == x0 else y0 + (y1 - y0) * (raw - x0) / (x1 - x0)

    # ---- files ---------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "x": list(self.xs), "y": list(self.ys),
                **({"meta": self.meta} if self.meta else {})}

    @classmethod
    def from_json(cls, data: object, where: str = "calibration") -> Calibration:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CalibrationError(f"{where} is not a {FORMAT} file; refit it with "
                                   "`python -m dlm.drivers.evaluation.calibrate --model DIR` or delete it")
        if data.get("version") != VERSION:
            raise CalibrationError(f"{where} has version {data.get('version')!r}, this dlm-lsp reads {VERSION}; "
                                   "refit it with `python -m dlm.drivers.evaluation.calibrate --model DIR`")
        try:
            return cls(kind=data.get("kind", DEFAULT_KIND), xs=tuple(data.get("x", ())), ys=tuple(data.get("y", ())),
                       meta=dict(data.get("meta") or {}))
        except (CalibrationError, TypeError) as exc:
            raise CalibrationError(f"{where}: {exc}; refit it with "
                                   "`python -m dlm.drivers.evaluation.calibrate --model DIR` or delete it") from None

    @classmethod
    def load(cls, checkpoint_dir: str | Path | None) -> Calibration:
        """The checkpoint's calibration.json, or the identity when it has none."""
        if checkpoint_dir is None:
            return cls.identity()
        path = Path(checkpoint_dir) / FILE_NAME
        if not path.is_file():
            return cls.identity()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{path} cannot be read ({exc}); refit it with "
                                   "`python -m dlm.drivers.evaluation.calibrate --model DIR` or delete it") from None
        return cls.from_json(data, str(path))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")


def isotonic_fit(scores: Sequence[float], labels: Sequence[bool], bins: int = 10, kind: str = DEFAULT_KIND,
                 meta: dict | None = None) -> Calibration:
    """Isotonic map of P(label | score): pool adjacent violators over equal-count bins.

    Scores are sorted into at most `bins` groups of equal count (ties kept together),
    each group is a point (mean score, share of positives), and neighbouring points
    that decrease are pooled (weighted by count) until the shares never decrease.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels; pass one label per score")
    if not scores:
        raise ValueError("no examples to fit a calibration on; pass held-out predictions")
    if bins < 1:
        raise ValueError(f"bins={bins}: use at least 1")
    pairs = sorted((min(max(float(s), 0.0), 1.0), bool(y)) for s, y in zip(scores, labels))
    n = len(pairs)
    size = max(1, math.ceil(n / bins))
    groups: list[list[float]] = []  # [sum_x, positives, count]
    i = 0
    while i < n:
        j = min(n, i + size)
        while j < n and pairs[j][0] == pairs[j - 1][0]:  # a tie never straddles two groups
            j += 1
        chunk = pairs[i:j]
        groups.append([sum(x for x, _ in chunk), sum(1 for _, y in chunk if y), len(chunk)])
        i = j
    pooled: list[list[float]] = []
    for g in groups:
        pooled.append(list(g))
        while len(pooled) > 1 and pooled[-2][1] / pooled[-2][2] > pooled[-1][1] / pooled[-1][2]:
            b = pooled.pop()
            a = pooled[-1]
            a[0] += b[0]
            a[1] += b[1]
            a[2] += b[2]
    xs = tuple(sx / c for sx, _, c in pooled)
    ys = tuple(p / c for _, p, c in pooled)
    return Calibration(kind=kind, xs=xs, ys=ys, meta=dict(meta or {}))


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (how well scores rank positives above negatives); None
    without both classes. Ties count one half."""
    pos = sorted(s for s, y in zip(scores, labels) if y)
    neg = sorted(s for s, y in zip(scores, labels) if not y)
    if not pos or not neg:
        return None
    wins = 0.0
    for p in pos:
        below = bisect.bisect_left(neg, p)
        ties = bisect.bisect_right(neg, p) - below
        wins += below + 0.5 * ties
    return wins / (len(pos) * len(neg))
