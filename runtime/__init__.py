"""How the pipeline runs under Prefect: where data lives, what is cached, who runs it, who waits.

- :mod:`runtime.catalog`: where each dataset lives under a data directory.
- :mod:`runtime.caching`: the tasks' cache keys (content, config, library code) and reading a cached result.
- :mod:`runtime.reuse`: what the flows call to reuse cached work: one call, a per-user fan-out, the trainings.
- :mod:`runtime.reruns`: the record that lets a training rerun with nothing new skip MLflow.
- :mod:`runtime.runners`: the per-user fan-out on threads or a Dask cluster; trainings in processes (the
  flows' ``runner`` section).
- :mod:`runtime.sections`: flows whose parameters are typed sections; the flat names they replaced.
- :mod:`runtime.locking`: one writer per data directory, one registry writer per store.
- :mod:`runtime.progress`: one progress bar per fan-out instead of a log line per task run.
- :mod:`runtime.compat`: every private API of Prefect or CPython, each behind one named shim.

It imports Prefect and the :mod:`nextloc` library, never MLflow; :mod:`tracking`, :mod:`tasks` and
:mod:`flows` build on it.
"""
