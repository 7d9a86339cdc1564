"""The plan of a mixture's epoch (docs/mixing.md): the weights by step (`Schedule`), the
counts of a global batch by largest remainder carried from step to step (`step_counts`),
and where the plan is after any number of steps (`Planner`) — each source's pass and
position, the carry, the dropped sources, the rows read — which is also what a mixture's
`state_dict()` records. Pure Python over whole numbers and fractions: the same on every
rank and worker.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._quiver import ValidationError

POLICIES = ("repeat", "stop", "drop")


def _fraction(name: str, value: Any) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise ValidationError(f"weight of `{name}` must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(f"weight of `{name}` must be finite, got {value!r}")
    w = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if w < 0:
        raise ValidationError(f"weight of `{name}` is negative ({value!r})")
    return w


class Schedule:
    """Weights by step: points ``(step, {source: weight})``, each holding from its step
    (a phase), or ``(step, weights, "linear")``, reached by a linear ramp from the point
    before it. Weights need not sum to 1: a step's are normalised."""

    def __init__(self, names: Sequence[str], weights: Optional[Mapping[str, Any]],
                 schedule: Optional[Sequence[Any]]):
        if (weights is None) == (schedule is None):
            raise ValidationError("a mixture takes weights= or schedule=, one of them")
        points = [(0, weights)] if schedule is None else list(schedule)
        if not points:
            raise ValidationError("schedule= is empty")
        self.names = list(names)
        self.points: List[Tuple[int, List[Fraction], bool]] = []
        for i, point in enumerate(points):
            if not isinstance(point, (tuple, list)) or len(point) not in (2, 3):
                raise ValidationError(f"schedule point {i}: expected (step, weights) or (step, weights, 'linear'), "
                                      f"got {point!r}")
            step, ws = point[0], point[1]
            linear = len(point) == 3
            if linear and point[2] != "linear":
                raise ValidationError(f"schedule point {i}: the third item is 'linear' (a ramp), got {point[2]!r}")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ValidationError(f"schedule point {i}: step must be a whole number >= 0, got {step!r}")
            if i == 0 and step != 0:
                raise ValidationError(f"schedule point 0 is at step {step}: the schedule starts at step 0")
            if i == 0 and linear:
                raise ValidationError("schedule point 0 cannot be a ramp (there is nothing before it)")
            if i > 0 and step <= self.points[-1][0]:
                raise ValidationError(f"schedule point {i} is at step {step}, not after point {i - 1}'s step "
                                      f"{self.points[-1][0]}: steps go forward")
            if not isinstance(ws, Mapping):
                raise ValidationError(f"schedule point {i}: weights must be a mapping of source to weight")
            unknown = [k for k in ws if k not in self.names]
            if unknown:
                raise ValidationError(f"weights name `{unknown[0]}`, which is not a source of the mixture "
                                      f"(sources: {', '.join(self.names)})")
            row = [_fraction(n, ws.get(n, 0)) for n in self.names]
            if sum(row) == 0:
                raise ValidationError(f"schedule point {i} (step {step}): every weight is zero")
            self.points.append((step, row, linear))

    def phase(self, step: int) -> int:
        """The index of the point whose phase (or ramp) ``step`` is in: the last at or
        before it."""
        p = 0
        for i, (at, _, _) in enumerate(self.points):
            if at <= step:
                p = i
        return p

    def ramps(self, phase: int) -> bool:
        """Whether the weights change step by step in ``phase`` (a ramp follows it)."""
        return phase + 1 < len(self.points) and self.points[phase + 1][2]

    def weights(self, step: int) -> List[Fraction]:
        """The weights at ``step`` (before normalising): the phase's, or on a ramp the
        line between its ends."""
        i = self.phase(step)
        if i + 1 < len(self.points) and self.points[i + 1][2]:
            (a, wa, _), (b, wb, _) = self.points[i], self.points[i + 1]
            t = Fraction(step - a, b - a)
            return [x + (y - x) * t for x, y in zip(wa, wb)]
        return list(self.points[i][1])

    def describe(self) -> List[Dict[str, Any]]:
        return [{"step": at, "weights": {n: float(w) for n, w in zip(self.names, ws)}, **({"ramp": "linear"} if lin else {})}
                for at, ws, lin in self.points]


def step_counts(total: int, weights: Sequence[Fraction], carry: List[Fraction]) -> List[int]:
    """A global batch of ``total`` rows split by ``weights`` (normalised here; a zero
    weight gets nothing): each source ``floor`` or ``ceil`` of its exact share, the extra
    rows to the sources with the largest share-plus-carry (ties: the first source), and
    ``carry`` (each source's exact running total less its rows so far) updated in place."""
    norm = sum(weights)
    shares = [total * w / norm for w in weights]
    floors = [math.floor(x) for x in shares]
    extra = total - sum(floors)
    deficit = [carry[k] + shares[k] - floors[k] for k in range(len(weights))]
    eligible = [k for k in range(len(weights)) if shares[k] != floors[k]]
    eligible.sort(key=lambda k: (-deficit[k], k))
    counts = list(floors)
    for k in eligible[:extra]:
        counts[k] += 1
    for k in range(len(weights)):
        carry[k] = deficit[k] - (counts[k] - floors[k])
    return counts


class Planner:
    """Where an epoch's plan is after some steps: each source's pass and position, the
    carried remainders, the dropped sources, the rows read per source (per phase too),
    and whether the epoch has ended. :meth:`next` plans one more step."""

    def __init__(self, rows: Sequence[int], schedule: Schedule, policies: Sequence[str], steps: Optional[int]):
        self.rows, self.schedule, self.policies, self.limit = list(rows), schedule, list(policies), steps
        n = len(rows)
        self.step = 0
        self.passes = [0] * n
        self.position = [0] * n
        self.carry = [Fraction(0)] * n
        self.dropped = [False] * n
        self.read = [0] * n
        self.read_by_phase: Dict[int, List[int]] = {}
        self.ended = False
        # While the global batch and the weights stay the same (a phase), the carry is
        # kept as whole numbers over one denominator: the same arithmetic as
        # `step_counts`, without a fraction's cost per operation.
        self._key: Any = None
        self._ints: Tuple[List[int], int, int] = ([], 1, 1)
        self._units: List[int] = []
        self._sig: Any = None
        self._weights: List[Fraction] = []
        self._memo: Dict[Tuple[int, ...], Tuple[Tuple[int, ...], List[int]]] = {}
        # `advance`'s quick path: the global batch and the step before which the weights
        # stay those entered (a phase without a ramp), or None.
        self._steady: Optional[Tuple[int, int]] = None

    def _enter(self, total: int, weights: List[Fraction]) -> None:
        """Keeps the carry in whole numbers over one denominator while ``weights`` hold."""
        key = (total, tuple(weights))
        if key == self._key:
            return
        self._sync()
        den = math.lcm(*[w.denominator for w in weights])
        a = [int(w * den) for w in weights]
        whole = sum(a)
        unit = math.lcm(whole, *[c.denominator for c in self.carry])
        self._key, self._ints = key, (a, whole, unit)
        self._units = [int(c * unit) for c in self.carry]
        self._memo = {}

    def _step(self, total: int) -> List[int]:
        """`step_counts(total, weights, self.carry)` for the weights entered, in whole
        numbers."""
        counts, self._units = self._counts(total, self._units)
        return list(counts)

    def _counts(self, total: int, units: List[int]) -> Tuple[Tuple[int, ...], List[int]]:
        """A step's counts from the carry ``units`` and the carry after it (``units``
        untouched); remembered by carry while the weights hold, so the steps of a phase
        repeat a few of them."""
        key = tuple(units)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        a, whole, unit = self._ints
        scale = unit // whole
        floors = [total * x // whole for x in a]
        rems = [total * x % whole for x in a]
        extra = total - sum(floors)
        deficit = [units[k] + rems[k] * scale for k in range(len(a))]
        eligible = [k for k in range(len(a)) if rems[k]]
        eligible.sort(key=lambda k: (-deficit[k], k))
        counts = list(floors)
        for k in eligible[:extra]:
            counts[k] += 1
        after = [deficit[k] - (counts[k] - floors[k]) * unit for k in range(len(a))]
        if len(self._memo) < 4096:
            self._memo[key] = (tuple(counts), after)
        return tuple(counts), after

    def _sync(self) -> None:
        """The carry back from whole numbers to fractions (the next step enters the
        weights again)."""
        self._steady = None
        if self._key is not None:
            unit = self._ints[2]
            self.carry = [Fraction(u, unit) for u in self._units]
            self._key = self._sig = None

    def state(self) -> Dict[str, Any]:
        self._sync()
        return {"step": self.step, "passes": list(self.passes), "position": list(self.position),
                "carry": [str(c) for c in self.carry], "dropped": list(self.dropped), "read": list(self.read),
                "read_by_phase": {str(p): list(v) for p, v in self.read_by_phase.items()}, "ended": self.ended}

    def load(self, state: Mapping[str, Any]) -> None:
        self._key = self._sig = self._steady = None
        self.step = int(state["step"])
        self.passes, self.position = [int(x) for x in state["passes"]], [int(x) for x in state["position"]]
        self.carry = [Fraction(c) for c in state["carry"]]
        self.dropped, self.read = [bool(x) for x in state["dropped"]], [int(x) for x in state["read"]]
        self.read_by_phase = {int(p): [int(x) for x in v] for p, v in state["read_by_phase"].items()}
        self.ended = bool(state["ended"])

    def next(self, total: int) -> Optional[List[Tuple[int, int, int, int]]]:
        """The next step's takes, ``(source, pass, first, end)`` row ranges of each
        source's pass order in the step's layout order, or ``None`` when the epoch is
        over."""
        if self.ended or (self.limit is not None and self.step >= self.limit):
            self.ended = True
            return None
        n = len(self.rows)
        phase = self.schedule.phase(self.step)
        ramp = self.schedule.ramps(phase)
        sig = (phase, self.step if ramp else -1, tuple(self.dropped), total)
        if sig == self._sig:
            weights = self._weights
        else:
            weights = self.schedule.weights(self.step)
            active = [Fraction(0) if self.dropped[k] else w for k, w in enumerate(weights)]
            if sum(active) == 0:
                self.ended = True
                return None
            self._enter(total, active)
            self._sig, self._weights = sig, weights
        self._steady = None
        counts = self._step(total)
        takes: List[Tuple[int, int, int, int]] = []
        final = False
        # A `drop` source that runs out leaves what it lacked to the sources still live,
        # by their weights (again, should another run out).
        while True:
            short = 0
            for k in range(n):
                if counts[k] <= 0:
                    continue
                got = self._take(k, counts[k], takes)
                if got < counts[k]:
                    if self.policies[k] == "stop":
                        final = True
                    else:
                        self.dropped[k] = True
                        short += counts[k] - got
            if short == 0 or final:
                break
            others = [Fraction(0) if self.dropped[k] else w for k, w in enumerate(weights)]
            if sum(others) == 0:
                break
            counts = step_counts(short, others, [Fraction(0)] * n)
        if not takes:
            self.ended = True
            return None
        # A source read to its end: `stop` ends the epoch with this step, `drop` is done.
        for k in range(n):
            if self.position[k] == self.rows[k] and self.policies[k] != "repeat":
                final = final or self.policies[k] == "stop"
                self.dropped[k] = self.dropped[k] or self.policies[k] == "drop"
        by_phase = self.read_by_phase.setdefault(phase, [0] * n)
        for k, _p, a, b in takes:
            self.read[k] += b - a
            by_phase[k] += b - a
        self.step += 1
        if final or all(self.dropped):
            self.ended = True
        elif not ramp and sig == self._sig and tuple(self.dropped) == sig[2]:
            nxt = [at for at, _, _ in self.schedule.points if at > self.step - 1]
            self._steady = (total, nxt[0] if nxt else -1)
        return takes

    def advance(self, total: int) -> Optional[Tuple[Tuple[int, ...], List[int]]]:
        """The next step as ``(counts, starts)``: the rows it takes from each source and
        where in the source's sequence of passes they start (``pass * rows + position``;
        a source's rows of a step are consecutive there; a source it takes none from, where
        that source stands), or ``None`` when the epoch is
        over. The same plan as :meth:`next`; a step inside a phase that no source
        finishes is planned from the remembered counts."""
        steady = self._steady
        if (steady is not None and steady[0] == total and (steady[1] < 0 or self.step < steady[1])
                and (self.limit is None or self.step < self.limit)):
            counts, after = self._counts(total, self._units)
            rows, position = self.rows, self.position
            if all(c == 0 or c < rows[k] - position[k] for k, c in enumerate(counts)):
                starts = [p * r + q for p, r, q in zip(self.passes, rows, position)]
                by_phase = self.read_by_phase[self._sig[0]]
                for k, c in enumerate(counts):
                    position[k] += c
                    self.read[k] += c
                    by_phase[k] += c
                self._units = after
                self.step += 1
                return counts, starts
        takes = self.next(total)
        if takes is None:
            return None
        counts_l = [0] * len(self.rows)
        # A source the step takes nothing from stays where it was.
        starts_l = [p * r + q for p, r, q in zip(self.passes, self.rows, self.position)]
        for k, p, a, b in takes:
            if counts_l[k] == 0:
                starts_l[k] = p * self.rows[k] + a
            counts_l[k] += b - a
        return tuple(counts_l), starts_l

    def _take(self, k: int, want: int, takes: List[Tuple[int, int, int, int]]) -> int:
        """Up to ``want`` rows of source ``k`` from its position (a `repeat` source goes
        on into its next pass); returns how many."""
        got = 0
        while got < want:
            left = self.rows[k] - self.position[k]
            if left == 0:
                if self.policies[k] != "repeat" or self.rows[k] == 0:
                    break
                self.passes[k] += 1
                self.position[k] = 0
                continue
            m = min(left, want - got)
            takes.append((k, self.passes[k], self.position[k], self.position[k] + m))
            self.position[k] += m
            got += m
        return got
