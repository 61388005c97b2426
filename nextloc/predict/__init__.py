"""Asking where next: from a person's visits or GPS fixes to the next places, named, with coordinates.

- :mod:`~nextloc.predict.answer`: the answers (:func:`~nextloc.predict.answer.predict_visits`).
- :mod:`~nextloc.predict.history_reader`: reading what a person sends (visits, raw fixes, samples).
- :mod:`~nextloc.predict.histories`: visits -> histories in the model's ids, as preprocessing builds them.
- :mod:`~nextloc.predict.answer_set`: the fewest answers holding a probability (``--coverage``).

Maps of the answers are :mod:`nextloc.maps`.

The registered models' format is :mod:`nextloc.bundle`; the packed histories a network reads,
:mod:`nextloc.models.packed`. A model registered before the library was grouped
in stages imports ``nextloc.predict.predict_visits``: it resolves here, on first use.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("predict", "predict_visits"):  # imported on first use: answer imports nextloc.bundle
        from nextloc.predict import answer

        return getattr(answer, name)
    raise AttributeError(f"module 'nextloc.predict' has no attribute {name!r}")
