"""What the command line prints: the answers and their sets, the leaderboard, the preprocessing summary."""

from __future__ import annotations

from typing import Any


def print_answers(answers: list[dict[str, Any]]) -> None:
    """One table per history: its user and time, P(new place), then the places; with ``--coverage``, a
    second one of the answer set."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    for answer in answers:
        about = {k: v for k, v in answer.items() if k not in ("places", "p_new_place", "answer_set")}
        title = ", ".join(f"{k} {v}" for k, v in about.items())
        p_new = answer.get("p_new_place")
        table = Table(title=title, caption=f"P(new place) {p_new:.3f}" if p_new is not None else None)
        columns = [
            c
            for c in ("rank", "location_id", "latitude", "longitude", "n_visits", "probability")
            if any(c in place for place in answer["places"])
        ]
        for column in columns:
            table.add_column(column, justify="right")
        for place in answer["places"]:
            table.add_row(*(_cell(place.get(c)) for c in columns))
        console.print(table)
        if "answer_set" in answer:
            console.print(_set_table(answer["answer_set"]))


def _set_table(chosen: dict[str, Any]) -> Any:
    """The answer set: its members, most likely first ("new place" for a place the model never saw)."""
    from rich.table import Table

    members = chosen["members"]
    title = f"answer set for coverage {chosen['coverage']:g}: {len(members)} member(s)"
    table = Table(title=title, caption=f"total probability {chosen['total_probability']:.3f}")
    columns = [
        c
        for c in ("location_id", "latitude", "longitude", "n_visits", "probability")
        if c == "location_id" or any(c in m for m in members)
    ]
    for column in columns:
        table.add_column(column, justify="right")
    for member in members:
        cells = {**member, "location_id": "new place"} if member.get("new_place") else member
        table.add_row(*(_cell(cells.get(c)) for c in columns))
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def print_leaderboard(board: dict[str, Any], caption: str) -> None:
    from nextloc.evaluation.leaderboard import build_leaderboard, print_terminal

    print_terminal(build_leaderboard(board), caption)


def print_summary(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    stats = result["stats"]
    table = Table(title=f"nextloc preprocess -> {result['data_dir']}")
    table.add_column("")
    for split in ("train", "val", "test"):
        table.add_column(split, justify="right")
    for key in ("n_users", "n_staypoints", "n_samples", "n_unseen_targets"):
        table.add_row(key, *(f"{stats[key][s]:,}" for s in ("train", "val", "test")))
    console = Console(stderr=False)
    console.print(table)
    console.print(
        f"total_loc_num {stats['total_loc_num']:,} | total_user_num {stats['total_user_num']} | "
        f"rows skipped {result['ingest']['rows_skipped']} | files skipped {result['ingest']['files_skipped']}"
    )
    duplicates = result["ingest"].get("duplicates")
    if duplicates and duplicates["pairs"]:
        from nextloc.raw.duplicates import describe_pairs

        console.print(
            f"users sharing recordings: {describe_pairs(duplicates, 5)} | {duplicates['copied_test_samples']} of "
            f"{duplicates['test_samples']} test samples are copies | {duplicates['n_files_dropped']} files dropped"
        )


def print_comparison(tracking_uri: str | None, experiment: str) -> None:
    """Where the models are compared: the tracking server's comparison view, or the command that starts
    MLflow's UI on the project's store (``nextloc ui``) and the URL it opens."""
    from rich.console import Console

    from services.layout import HOST
    from services.ui import DEFAULT_PORT
    from tracking import mlflow_runs
    from tracking.settings import default_tracking_uri, tracking_server

    uri = tracking_uri or default_tracking_uri()
    experiment_id = mlflow_runs.experiment_id(uri, experiment)
    if experiment_id is None:
        return
    if server := tracking_server(uri):
        Console().print(
            f"compare the models: {mlflow_runs.comparison_url(server, experiment_id)}", soft_wrap=True
        )
        return
    url = mlflow_runs.comparison_url(f"http://{HOST}:{DEFAULT_PORT}", experiment_id)
    Console().print(
        f"compare the models: .venv/bin/nextloc ui (MLflow's UI on this store), then {url}", soft_wrap=True
    )
