"""The user's routine: what each known place has been to the user before *now*, as features per candidate.

A 7-day window shows a model a week of visits; the routine is the user's whole past. For a question asked
at time ``now`` about user ``u`` leaving place ``current``, every feature here is computed from the visits
that **started before** ``now``: ``u``'s own, and every user's for the place-popularity features and for
the places' centres (``log_km``: each place's centre is the mean of the coordinates of its visits before
``now``, running sums like the counts). Nothing that happens later can reach it
(``tests/nextloc/routine/test_routine.py`` removes every later visit and checks that no feature changes). A
registered model answers with the centres it was trained with instead (``Routine(..., centres=...)``): a
deployed answer has no future to leak.

``now`` is the moment the user leaves ``current``: in evaluation the end of the visit just before the
target, in an answer the request's ``at`` (default: the end of its last visit). The target's own arrival
time is never read: it is not known when the question is asked. (A stored tally may hold visits after
an answer's ``now``, when the question is asked about the past: they count, and times since a visit are
taken as 0 rather than negative.)

Place ids are the encoded ones (:mod:`nextloc.preprocessing.sequences`: 1 is a place outside the train vocabulary,
2.. known places). The candidates are the known places the user visited before ``now`` (a user is answered
with real places). The explore features count distinct places by ``raw_place``, so a first visit to a
place that no one visited in train still counts as exploring.

A :class:`Routine` is a set of :class:`~nextloc.routine.counts.EventCounts`, one per kind of count
(:data:`INDEXES`). :meth:`Routine.tally` stores them as counts per key (no visit list): the tally a
registered model carries, which a request's newer visits extend (``Routine(..., tally=...)``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from nextloc.preprocessing.sequences import EPOCH_WEEKDAY, FIRST_PLACE, UNSEEN
from nextloc.routine.counts import EventCounts, composite_key, first_of_pairs, rank_within
from nextloc.routine.tally import StoredTally
from nextloc.routine.visits import MINUTES_PER_DAY, Queries, VisitLog

WINDOW_MIN = 7 * MINUTES_PER_DAY  # the reference's history window
RECENT_MIN = 30 * MINUTES_PER_DAY
SLOT_MIN = 180  # a time-of-day slot: 3 hours
# Song et al. (2010), "Modelling the scaling properties of human mobility": P(explore) = rho * S^-gamma
SONG_RHO, SONG_GAMMA = 0.6, 0.21
CHUNK_QUESTIONS = 1 << 16  # questions whose candidates' features are computed at once (Routine.features)

CANDIDATE_FEATURES = (
    "n_place",  # the user's visits to the place before now
    "share_place",  # ... over all the user's visits before now
    "n_window",  # visits to the place in the 7 days before now
    "share_window",
    "share_slot",  # share among the user's visits that started in now's 3-hour slot of the day
    "n_slot",
    "share_hour3",  # share among the user's visits that started within about an hour of now's time of day
    "share_daytype",  # share among the user's visits on the same kind of day (weekday / weekend)
    "share_daytype_slot",
    "share_week_hour3",  # share among the user's visits on the same weekday within about an hour of now
    "n_today",  # the user's visits to the place since midnight
    "n_transition",  # the user's moves from the current place to this one
    "share_transition",  # ... over the user's moves out of the current place
    "share_transition_slot",  # the same, for moves that left in now's slot
    "share_transition2",  # the user's moves previous -> current -> place over previous -> current -> any
    "log_days_since",  # log1p of days since the user's last visit to the place
    "recency_rank",  # 1 + the candidates the user visited more recently than this one
    "log_dwell",  # log1p of the mean minutes the user stays there
    "is_current",  # the place the user is leaving
    "is_previous",  # the place the user came from to the current one
    "log_km",  # log1p of the distance from the current place's centre, km (NaN: no centre)
    "log_popularity",  # log1p of every user's visits to the place before now
    "share_global_transition",  # every user's moves current -> place over their moves out of current
    # the question itself, so that the trees can condition on it
    "hour",  # now's hour of the day
    "weekend",
    "log_dwell_current",  # log1p of minutes at the current place
    "log_user_visits",  # log1p of the user's visits before now
)
EXPLORE_FEATURES = (
    "log_visits",  # log1p of the user's visits before now
    "log_distinct",  # log1p of the distinct places the user visited before now
    "new_share",  # first visits over visits: how often the user went somewhere new
    "unseen_share",  # visits to places outside the train vocabulary over visits
    "recent_unseen_share",  # the same over the 30 days before now
    "log_days_since_new",  # log1p of days since the user's last first visit
    "song_explore",  # rho * S^-gamma (Song et al. 2010)
    "move_unseen_share",  # the user's moves out of the current place that went outside the vocabulary
    "global_move_unseen_share",  # the same over every user
    "log_current_visits",  # log1p of the user's visits to the current place
)

# name -> (events, key columns, summed value, keeps the latest time in a tally)
INDEXES: dict[str, tuple[str, tuple[str, ...], str | None, bool]] = {
    "user": ("visit", ("u",), None, True),
    "place": ("visit", ("u", "p"), "dwell", True),
    "slot": ("visit", ("u", "p", "slot"), None, False),
    "user_slot": ("visit", ("u", "slot"), None, False),
    "hour": ("visit", ("u", "p", "hour"), None, False),
    "user_hour": ("visit", ("u", "hour"), None, False),
    "day": ("visit", ("u", "p", "day"), None, False),
    "user_day": ("visit", ("u", "day"), None, False),
    "day_slot": ("visit", ("u", "p", "day", "slot"), None, False),
    "user_day_slot": ("visit", ("u", "day", "slot"), None, False),
    "week_hour": ("visit", ("u", "p", "week_hour"), None, False),
    "user_week_hour": ("visit", ("u", "week_hour"), None, False),
    "global_place": ("visit", ("p",), None, False),
    "unseen": ("unseen", ("u",), None, False),
    "first": ("first", ("u",), None, True),
    "move": ("move", ("u", "src", "p"), None, False),
    "move_out": ("move", ("u", "src"), None, False),
    "move_slot": ("move", ("u", "src", "leave", "p"), None, False),
    "move_slot_out": ("move", ("u", "src", "leave"), None, False),
    "global_move": ("move", ("src", "p"), None, False),
    "global_move_out": ("move", ("src",), None, False),
    "move2": ("move2", ("u", "prev", "src", "p"), None, False),
    "move2_out": ("move2", ("u", "prev", "src"), None, False),
}
_RADIX = {"slot": 8, "leave": 8, "hour": 24, "day": 2, "week_hour": 168}  # the place columns: num_places


def song_explore(distinct: np.ndarray) -> np.ndarray:
    """Song et al.'s probability of exploring after ``distinct`` places: ``rho * S^-gamma``."""
    return SONG_RHO * np.maximum(np.asarray(distinct, dtype=np.float64), 1.0) ** -SONG_GAMMA


def _slot(minutes: np.ndarray, width: int = SLOT_MIN) -> np.ndarray:
    return (np.asarray(minutes, dtype=np.int64) % MINUTES_PER_DAY) // width


def _weekend(minutes: np.ndarray) -> np.ndarray:
    return ((np.asarray(minutes) // MINUTES_PER_DAY + EPOCH_WEEKDAY) % 7 >= 5).astype(np.int64)


def _week_hour(minutes: np.ndarray) -> np.ndarray:
    return (np.asarray(minutes) // MINUTES_PER_DAY + EPOCH_WEEKDAY) % 7 * 24 + _slot(minutes, 60)


def _share(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    numerator = np.asarray(numerator, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def _events(
    log: VisitLog, known_pairs: np.ndarray | None
) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
    """The log as events of each kind: ``kind -> (columns, start times)``."""
    u, p, s = log.user, log.place, log.start
    visit = {
        "u": u,
        "p": p,
        "slot": _slot(s),
        "hour": _slot(s, 60),
        "day": _weekend(s),
        "week_hour": _week_hour(s),
    }
    visit["dwell"] = (log.end - s).astype(np.float64)
    unseen = p == UNSEEN
    fu, fr, first_start = first_of_pairs(u, log.raw_place, s)
    fresh = (
        np.ones(len(fu), dtype=bool) if known_pairs is None else ~np.isin(fu * (1 << 32) + fr, known_pairs)
    )
    move = np.flatnonzero(u[1:] == u[:-1]) + 1
    moves = {"u": u[move], "src": p[move - 1], "p": p[move], "leave": _slot(log.end[move - 1])}
    two = move[(move >= 2) & (u[np.maximum(move - 2, 0)] == u[move])]
    moves2 = {"u": u[two], "prev": p[two - 2], "src": p[two - 1], "p": p[two]}
    return {
        "visit": (visit, s),
        "unseen": ({"u": u[unseen]}, s[unseen]),
        "first": ({"u": fu[fresh]}, first_start[fresh]),
        "move": (moves, s[move]),
        "move2": (moves2, s[two]),
    }


class Routine:
    """The counts behind :data:`CANDIDATE_FEATURES` and :data:`EXPLORE_FEATURES` for a visit log.

    Args:
        log: every visit that may be counted (any split: only those before each query's ``now`` are).
        num_places: the encoded place vocabulary's size (``total_loc_num``).
        centres: ``(num_places, 2)`` fixed latitude/longitude of each encoded place (NaN where unknown: a
            registered model's); None: each place's centre as of each question's ``now``, from the log's
            coordinates (NaN where the log has none).
        tally: earlier visits as counts (:meth:`tally` of a routine over them), counted as before
            every ``now``; ``log`` then holds only the visits after them.
        centre_log: the visits whose coordinates give the centres as of ``now`` (same place ids; default
            ``log``): a dataset's located staypoints, every user's before merging.
    """

    def __init__(
        self,
        log: VisitLog,
        num_places: int,
        centres: np.ndarray | None = None,
        tally: pd.DataFrame | StoredTally | None = None,
        centre_log: VisitLog | None = None,
    ) -> None:
        self.log = log
        self.num_places = int(num_places)
        self.centres = centres
        self.located: tuple[EventCounts, EventCounts] | None = None  # every user's coordinates per place
        source = log if centre_log is None else centre_log
        if centres is None and source.located:
            self.located = (
                EventCounts(source.place, source.start, source.latitude),
                EventCounts(source.place, source.start, source.longitude),
            )
        stored = StoredTally.from_frame(tally) if isinstance(tally, pd.DataFrame) else tally
        self.stored = stored
        self._last_cutoff: tuple[np.ndarray, np.ndarray] | None = None  # (users array, its cutoffs)
        events = _events(log, stored.known_pairs(self.num_places) if stored is not None else None)
        self.counts: dict[str, EventCounts] = {}
        for name, (kind, columns, value, _) in INDEXES.items():
            fields, times = events[kind]
            base = None
            if stored is not None:
                base = stored.base(name)
                if "u" not in columns:  # an index over every user: add only what the tally did not count
                    new = times > stored.end_of(fields["u"])
                    fields, times = {c: v[new] for c, v in fields.items()}, times[new]
            values = fields[value] if value else None
            self.counts[name] = EventCounts(
                self.key(name, **{c: fields[c] for c in columns}), times, values, base
            )

    def key(self, name: str, **columns: np.ndarray) -> np.ndarray:
        """The key of index ``name`` for the given columns (named as in :data:`INDEXES`)."""
        names = INDEXES[name][1]
        sizes = tuple(_RADIX.get(c, self.num_places) for c in names)
        return composite_key(*(columns[c] for c in names), sizes=sizes)

    def count(self, name: str, now: np.ndarray, **columns: np.ndarray) -> np.ndarray:
        """Events of index ``name`` with these column values that started before ``now`` (with a tally:
        its counts, plus the user's visits after the tally's last one)."""
        return self.counts[name].count(self.key(name, **columns), now, self._cutoff(columns))

    def _cutoff(self, columns: dict[str, np.ndarray]) -> np.ndarray | None:
        """Per row, the time before which the user's visits are in the tally already (None: no tally,
        or an index over every user, which holds only what the tally did not count)."""
        if self.stored is None or "u" not in columns:
            return None
        users = columns["u"]
        if self._last_cutoff is None or self._last_cutoff[0] is not users:  # a feature's counts share one
            self._last_cutoff = (users, self.stored.end_of(users) + 1)
        return self._last_cutoff[1]

    def tally(self) -> pd.DataFrame:
        """Every index as counts per key (``index``, ``key``, ``count``, ``total``, ``last``); the latest
        time only where a feature reads it (:data:`INDEXES`). No visit is stored."""
        return pd.concat(list(self.tally_parts()), ignore_index=True)

    def tally_parts(self, prefix: str = "") -> Iterator[pd.DataFrame]:
        """:meth:`tally` index by index, each name after ``prefix`` (what a bundle is written from: one
        index held at a time)."""
        for name, (_, _, _, keeps_last) in INDEXES.items():
            snapshot = self.counts[name].snapshot(with_last=keeps_last)
            snapshot.insert(0, "index", prefix + name)
            yield snapshot

    def candidates(self, queries: Queries) -> tuple[np.ndarray, np.ndarray]:
        """The known places each query's user visited before its ``now``: ``(query row, place)`` pairs,
        query by query, places ascending."""
        index = self.counts["place"]
        keys = np.union1d(index.keys, index.base.key)
        keys = keys[keys % self.num_places >= FIRST_PLACE]
        users = keys // self.num_places
        lo = np.searchsorted(users, queries.user, side="left")
        lengths = np.searchsorted(users, queries.user, side="right") - lo
        query = np.repeat(np.arange(len(queries)), lengths)
        rows = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths - lo, lengths)
        keep = index.count(keys[rows], queries.now[query]) > 0
        return query[keep], keys[rows[keep]] % self.num_places

    def candidate_features(self, queries: Queries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(query row, place, features)``: :meth:`candidates` with :meth:`features`."""
        q, place = self.candidates(queries)
        return q, place, self.features(queries, q, place)

    def features(self, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
        """``(rows, F)`` float64: :data:`CANDIDATE_FEATURES` of candidates ``(q, place)`` (NaN where
        undefined), filled from :meth:`feature_chunks`: beside the array, one chunk's columns are held."""
        out = np.empty((len(q), len(CANDIDATE_FEATURES)))
        start = 0
        for chunk in self.feature_chunks(queries, q, place):
            out[start : start + len(chunk)] = chunk
            start += len(chunk)
        return out

    def feature_chunks(
        self, queries: Queries, q: np.ndarray, place: np.ndarray, chunk: int = CHUNK_QUESTIONS
    ) -> Iterator[np.ndarray]:
        """:meth:`features` of ``chunk`` questions at a time, in row order (``q`` ascending, each question's
        candidates all there: a question's rank features read its other candidates)."""
        bounds = np.searchsorted(q, np.arange(0, len(queries) + chunk, chunk))
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                rows = q[lo:hi], place[lo:hi]
                columns = {**self._visit_features(queries, *rows), **self._move_features(queries, *rows)}
                yield np.column_stack([columns[name] for name in CANDIDATE_FEATURES])

    def _visit_features(self, queries: Queries, q: np.ndarray, place: np.ndarray) -> dict[str, np.ndarray]:
        u, now = queries.user[q], queries.now[q]
        slot, hour, day, week_hour = _slot(now), _slot(now, 60), _weekend(now), _week_hour(now)
        n_user = self.count("user", now, u=u)
        n_place = self.count("place", now, u=u, p=place)
        n_window = n_place - self.count("place", now - WINDOW_MIN, u=u, p=place)
        n_slot = self.count("slot", now, u=u, p=place, slot=slot)
        near = [(hour + d) % 24 for d in (-1, 0, 1)]
        near_week = [week_hour - week_hour % 24 + h for h in near]
        key = self.key("place", u=u, p=place)
        last = self.counts["place"].last(key, now)
        midnight = now - now % MINUTES_PER_DAY
        return {
            "n_place": n_place,
            "share_place": _share(n_place, n_user),
            "n_window": n_window,
            "share_window": _share(n_window, n_user - self.count("user", now - WINDOW_MIN, u=u)),
            "share_slot": _share(n_slot, self.count("user_slot", now, u=u, slot=slot)),
            "n_slot": n_slot,
            "share_hour3": _share(
                sum(self.count("hour", now, u=u, p=place, hour=h) for h in near),
                sum(self.count("user_hour", now, u=u, hour=h) for h in near),
            ),
            "share_daytype": _share(
                self.count("day", now, u=u, p=place, day=day), self.count("user_day", now, u=u, day=day)
            ),
            "share_daytype_slot": _share(
                self.count("day_slot", now, u=u, p=place, day=day, slot=slot),
                self.count("user_day_slot", now, u=u, day=day, slot=slot),
            ),
            "share_week_hour3": _share(
                sum(self.count("week_hour", now, u=u, p=place, week_hour=h) for h in near_week),
                sum(self.count("user_week_hour", now, u=u, week_hour=h) for h in near_week),
            ),
            "n_today": n_place - self.count("place", midnight, u=u, p=place),
            "log_days_since": np.log1p(np.maximum(now - last, 0) / MINUTES_PER_DAY),
            "recency_rank": rank_within(q, -np.nan_to_num(last, nan=-np.inf)),
            "log_dwell": np.log1p(
                _share(self.counts["place"].total(key, now, self._cutoff({"u": u})), n_place)
            ),
            "log_popularity": np.log1p(self.count("global_place", now, p=place)),
            "hour": hour.astype(np.float64),
            "weekend": day.astype(np.float64),
            "log_dwell_current": np.log1p(np.maximum(now - queries.arrived[q], 0)).astype(np.float64),
            "log_user_visits": np.log1p(n_user),
        }

    def _move_features(self, queries: Queries, q: np.ndarray, place: np.ndarray) -> dict[str, np.ndarray]:
        u, now, cur, prev = queries.user[q], queries.now[q], queries.current[q], queries.previous[q]
        leave = _slot(now)
        n_move = self.count("move", now, u=u, src=cur, p=place)
        return {
            "n_transition": n_move,
            "share_transition": _share(n_move, self.count("move_out", now, u=u, src=cur)),
            "share_transition_slot": _share(
                self.count("move_slot", now, u=u, src=cur, leave=leave, p=place),
                self.count("move_slot_out", now, u=u, src=cur, leave=leave),
            ),
            "share_transition2": _share(
                self.count("move2", now, u=u, prev=prev, src=cur, p=place),
                self.count("move2_out", now, u=u, prev=prev, src=cur),
            ),
            "is_current": (place == cur).astype(np.float64),
            "is_previous": (place == prev).astype(np.float64),
            "log_km": np.log1p(self._distance_km(cur, place, now)),
            "share_global_transition": _share(
                self.count("global_move", now, src=cur, p=place), self.count("global_move_out", now, src=cur)
            ),
        }

    def explore_features(self, queries: Queries) -> np.ndarray:
        """:data:`EXPLORE_FEATURES` of each query, ``(N, F)`` float64: how much the user explores."""
        u, now, cur = queries.user, queries.now, queries.current
        n_user = self.count("user", now, u=u)
        distinct = self.count("first", now, u=u)
        unseen = self.count("unseen", now, u=u)
        n_recent = n_user - self.count("user", now - RECENT_MIN, u=u)
        unseen_recent = unseen - self.count("unseen", now - RECENT_MIN, u=u)
        last_new = self.counts["first"].last(self.key("first", u=u), now)
        to_unseen = np.full(len(u), UNSEEN)
        columns = {
            "log_visits": np.log1p(n_user),
            "log_distinct": np.log1p(distinct),
            "new_share": _share(distinct, n_user),
            "unseen_share": _share(unseen, n_user),
            "recent_unseen_share": _share(unseen_recent, n_recent),
            "log_days_since_new": np.log1p(
                np.nan_to_num(np.maximum(now - last_new, 0) / MINUTES_PER_DAY, nan=1e4)
            ),
            "song_explore": song_explore(distinct),
            "move_unseen_share": _share(
                self.count("move", now, u=u, src=cur, p=to_unseen), self.count("move_out", now, u=u, src=cur)
            ),
            "global_move_unseen_share": _share(
                self.count("global_move", now, src=cur, p=to_unseen),
                self.count("global_move_out", now, src=cur),
            ),
            "log_current_visits": np.log1p(self.count("place", now, u=u, p=cur)),
        }
        return np.column_stack([columns[name] for name in EXPLORE_FEATURES])

    def centre(self, place: np.ndarray, now: np.ndarray) -> np.ndarray:
        """``(N, 2)`` latitude/longitude of each place as of ``now``: the mean of every user's visits there
        that started before it (NaN: none, or no coordinates), or the fixed centre given."""
        place = np.asarray(place, dtype=np.int64)
        if self.centres is not None:
            return self.centres[place]
        if self.located is None:
            return np.full((len(place), 2), np.nan)
        lat, lon = self.located
        n = lat.count(place, now)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.column_stack([lat.total(place, now), lon.total(place, now)]) / n[:, None]

    def _distance_km(self, a: np.ndarray, b: np.ndarray, now: np.ndarray) -> np.ndarray:
        lat1, lon1 = np.radians(self.centre(a, now)).T
        lat2, lon2 = np.radians(self.centre(b, now)).T
        h = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
        return 2 * 6371.0088 * np.arcsin(np.sqrt(np.clip(h, 0, 1)))
