"""The ``nextloc`` command: parsing the command line and handing it to the flows and the services.

- :mod:`commands.main`: the subcommands (``run``, ``preprocess``, ``train``, ``predict``, ``map``, ``serve``,
  ``services``, ``worker``, ...) and the embedded defaults they run with (the project's local Prefect API,
  :mod:`services.local_api`).
- :mod:`commands.args`: each subcommand's options and how they become the flows' inputs.
- :mod:`commands.output`: what the commands print (answers, leaderboards, the summary, where to compare).
- :mod:`commands.evaluate`: ``evaluate`` and ``predict`` on a registered model.
- :mod:`commands.dataset_map`: ``map``, a preprocessed data directory on a web map.

It imports :mod:`flows` and :mod:`services`; neither imports it back.
"""
