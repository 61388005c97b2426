"""The bundle format's old name: models registered before it became :mod:`nextloc.bundle` keep loading.

MLflow keeps a registered model's code as it was logged (:mod:`tracking.pyfunc_model`, models-from-code), and
that code imports ``BUNDLE_ARTIFACT`` and ``load_bundle`` from here (tests/tracking/test_old_registrations.py).
New code imports :mod:`nextloc.bundle`.
"""

from nextloc.bundle import BUNDLE_ARTIFACT, load_bundle

__all__ = ["BUNDLE_ARTIFACT", "load_bundle"]
