"""jaxfl report's tables where a sweep is not the usual grid: a swept target accuracy, a setting only
some algorithms read that is no algorithm field, a group without the reference, values that are
not numbers, and targets that are not whole percents (found by a review of the report on
2026-12-05; every committed table recomputed by hand matched)."""
import csv

import pytest

from jaxfl.report import format_markdown, group_columns, make_report, summarise


def _csv(path, header, lines):
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    return str(path)


def test_a_swept_target_makes_groups_not_seeds(tmp_path):
    # two targets × two seeds: each method's time to 60% and to 85% were averaged as four "seeds"
    rows = [{"algorithm": algorithm, "seed": seed, "target_accuracy": target, "time_to_target": time,
             "best_accuracy": 0.9}
            for algorithm, scale in [("fedavg", 1.0), ("fedbuff", 0.5)]
            for seed in (0, 1) for target, time in [(0.6, 10.0 * scale * (seed + 1)), (0.85, 100.0 * scale * (seed + 1))]]
    assert group_columns(rows) == ["target_accuracy"]
    lines = {(line["target_accuracy"], line["method"]): line for line in summarise(rows)}
    assert lines[(0.6, "fedavg")]["time_to_target_mean"] == 15.0 and lines[(0.85, "fedavg")]["time_to_target_mean"] == 150.0
    assert lines[(0.6, "fedbuff")]["relative_time"] == 0.5 and lines[(0.6, "fedbuff")]["runs"] == 2
    # one seed each per group: the seed-by-seed table keeps both seeds of each target
    assert [seed for seed, _, _ in lines[(0.85, "fedbuff")]["times_by_seed"]] == [0, 1]


def test_a_target_decided_by_a_swept_dataset_is_no_group_of_its_own():
    rows = [{"algorithm": "fedavg", "seed": 0, "dataset": dataset, "target_accuracy": target, "time_to_target": 5.0,
             "best_accuracy": 0.9} for dataset, target in [("mnist10k", 0.9), ("fashion_mnist", 0.8)]]
    assert group_columns(rows) == ["dataset"]


def test_a_setting_only_some_algorithms_read_names_their_variants(tmp_path):
    # FedAdam's server_tau beside FedAvg (which leaves it empty) was a group: FedAvg alone in one, "n/a" elsewhere
    table = _csv(tmp_path / "results.csv", "algorithm,server_tau,seed,time_to_target,best_accuracy",
                 ["fedavg,,0,100.0,0.9", "fedadam,0.001,0,50.0,0.91", "fedadam,0.01,0,80.0,0.92"])
    report = make_report([table], figures=False, out=str(tmp_path / "report"))
    assert [(line["method"], line["relative_time"]) for line in report.rows] == \
        [("fedavg", 1.0), ("fedadam server_tau=0.001", 0.5), ("fedadam server_tau=0.01", 0.8)]
    # a partition's setting, empty in every algorithm's IID rows, stays a group
    rows = [{"algorithm": algorithm, "partition": partition, "dirichlet_alpha": alpha, "seed": 0,
             "time_to_target": 1.0, "best_accuracy": 0.9}
            for algorithm in ("fedavg", "fedbuff") for partition, alpha in [("iid", None), ("dirichlet", 0.3)]]
    assert group_columns(rows) == ["partition", "dirichlet_alpha"]


def test_a_group_without_the_reference_shows_the_method_s_own_time_not_a_miss_of_the_reference(tmp_path):
    table = _csv(tmp_path / "results.csv", "algorithm,clients,seed,time_to_target,best_accuracy",
                 ["fedavg,5,0,100.0,0.9", "fedbuff,5,0,50.0,0.9", "fedbuff,10,0,70.0,0.9"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    assert "| fedbuff | 0.50 (50.0 s) | (70.0 s) |" in markdown
    assert "(12.0 s) alone = fedavg has no run in that group: the method's own time." in markdown
    assert "n/a (70.0 s)" not in markdown


@pytest.mark.parametrize("value", ["abc", "nan", "True"])
def test_a_value_that_is_no_number_is_named_with_its_file_line_and_column(tmp_path, value):
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy",
                 ["fedavg,0,10,0.9", f"fedbuff,0,{value},0.8"])
    with pytest.raises(ValueError, match="results.csv, line 3: time_to_target=.+ is not allowed: a number, or empty"):
        make_report([table], figures=False, out=str(tmp_path / "report"))
    assert not (tmp_path / "report").exists()


def test_a_target_is_shown_with_the_digits_it_has(tmp_path):
    table = _csv(tmp_path / "results.csv", "algorithm,seed,target_accuracy,time_to_target,best_accuracy",
                 ["fedavg,0,0.995,10,0.996"])
    assert "Time to first reach 99.5% held-out accuracy" in make_report([table], figures=False,
                                                                        out=str(tmp_path / "r")).markdown


def test_the_computation_column_is_what_clients_computed_not_how_the_engine_batched_it(tmp_path):
    """Two runs that differ only in clients_per_call (how the engine batches, not what a run
    computes) have the same event log and the same client_steps_arrived: the steps of the arrivals
    in the log. The engine's client_steps_executed also holds work trained ahead for updates the run
    never aggregated (here: the run stops at its target, at update 8 of 12), which grows with the call
    size; the report's computation column reads arrivals."""
    import dataclasses

    import numpy as np

    import jaxfl

    config = jaxfl.RunConfig(algorithm="fedasync", dataset="digits", model="logreg", clients=8, local_steps=5,
                             max_updates=12, heterogeneity="pareto", progress=False, target_accuracy=0.15,
                             output_dir=str(tmp_path))
    one, many = (jaxfl.run_experiment(dataclasses.replace(config, clients_per_call=k, run_name=f"k{k}"))
                 for k in (1, 8))
    events = jaxfl.load_run(one.run_dir).events
    arrived = int(events["steps"][events["event"] == "arrival"].sum())
    assert one.summary["client_steps_arrived"] == many.summary["client_steps_arrived"] == arrived
    assert jaxfl.load_run(many.run_dir).events["time"].tolist() == events["time"].tolist()
    assert one.summary["stop_reason"] == many.summary["stop_reason"] == "target reached"
    assert many.summary["client_steps_executed"] > one.summary["client_steps_executed"] >= arrived

    def row(result, algorithm):
        return {"algorithm": algorithm, "seed": 0, "time_to_target": None, "best_accuracy": 0.5,
                "final_accuracy": 0.5, **{key: result.summary[key] for key in
                                          ("client_steps_executed", "client_steps_arrived")}}

    line = {line["method"]: line for line in summarise([row(one, "fedavg"), row(many, "fedasync")])}["fedasync"]
    assert line["relative_steps"] == 1.0 and line["client_steps_counted"] == "client_steps_arrived"
    # a table from before the column: the engine's count, and the note says so
    old = [{key: value for key, value in row(result, name).items() if key != "client_steps_arrived"}
           for result, name in ((one, "fedavg"), (many, "fedasync"))]
    line = {line["method"]: line for line in summarise(old)}["fedasync"]
    assert line["client_steps_counted"] == "client_steps_executed" and line["relative_steps"] > 1.0
    assert np.isclose(line["relative_steps"], many.summary["client_steps_executed"] / one.summary["client_steps_executed"])


def test_runs_that_diverged_are_marked_where_their_accuracies_are_averaged(tmp_path):
    # a run stopped on a NaN model kept its last evaluation's accuracies: averaged unmarked, a method
    # whose learning rate blew up read as good as (or better than) one that trained
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy,final_accuracy,stop_reason",
                 ["fedavg,0,,0.30,0.28,time budget", "fedavg,1,,0.32,0.30,time budget",
                  "fedbuff,0,,0.12,0.12,numerical error: the global model (version 2) holds NaN",
                  "fedbuff,1,,0.40,0.38,time budget"])
    report = make_report([table], figures=False, out=str(tmp_path / "report"))
    lines = {line["method"]: line for line in report.rows}
    assert lines["fedbuff"]["diverged"] == 1 and lines["fedavg"]["diverged"] == 0
    assert "| fedbuff | 0.2600 ± 0.1400 [1 of 2 diverged] |" in report.markdown
    assert "| fedbuff | 0.2500 ± 0.1300 [1 of 2 diverged] |" in report.markdown  # the final accuracy's
    assert "stopped on a non-finite model" in report.markdown and "(fedbuff, seed 0)" in report.markdown
    with open(tmp_path / "report" / "report.csv", newline="") as handle:
        written = {row["method"]: row for row in csv.DictReader(handle)}
    assert (written["fedbuff"]["diverged"], written["fedbuff"]["diverged_seeds"]) == ("1", "0")
    assert (written["fedavg"]["diverged"], written["fedavg"]["diverged_seeds"]) == ("0", "")
    healthy = _csv(tmp_path / "healthy.csv", "algorithm,seed,time_to_target,best_accuracy",
                   ["fedavg,0,,0.3", "fedbuff,0,,0.4"])
    assert "diverged" not in make_report([healthy], figures=False, out=str(tmp_path / "healthy")).markdown


def test_a_method_whose_every_run_diverged_shows_a_dash_and_the_mark_for_its_best_accuracy(tmp_path):
    # every evaluation of a diverged model is left out of the best accuracy: none, where the cell was blank
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy,final_accuracy,stop_reason",
                 ["fedavg,0,,0.30,0.28,time budget",
                  "fedbuff,0,,,0.098,numerical error: the global model (version 1) gives NaN/Inf outputs"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    assert "| fedbuff | – [1 of 1 diverged] |" in markdown
    assert "best accuracy leaves out the evaluations of its diverged model" in markdown


def test_the_time_to_target_table_marks_diverged_runs_as_the_accuracy_tables_do(tmp_path):
    # a method that missed the target because its runs diverged read "–" like one that trained too slowly
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy,final_accuracy,stop_reason",
                 ["fedavg,0,40.0,0.30,0.28,target accuracy", "fedavg,1,60.0,0.32,0.30,target accuracy",
                  "fedbuff,0,,0.12,0.12,numerical error: the global model (version 2) holds NaN",
                  "fedbuff,1,30.0,0.40,0.38,target accuracy"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    time_table = markdown.split("## Best held-out accuracy")[0]
    assert "| fedbuff | – [1 of 2 diverged] |" in time_table
    assert "| fedavg | 1.00 (50.0 s) |" in time_table
    assert "reached the target only if it did before it diverged" in time_table


def test_the_last_tenth_of_a_diverged_run_s_evaluations_is_marked_too(tmp_path):
    # only the best and final accuracy tables carried the mark; a diverged run's last tenth is its NaN model's
    table = _csv(tmp_path / "results.csv",
                 "algorithm,seed,time_to_target,best_accuracy,final_accuracy,last_tenth_accuracy,stop_reason",
                 ["fedavg,0,,0.30,0.28,0.29,time budget",
                  "fedbuff,0,,0.20,0.098,0.098,numerical error: the global model (version 1) holds NaN"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    section = markdown.split("## Held-out accuracy over the last tenth of the evaluations, mean ± std")[1]
    assert "| fedbuff | 0.0980 ± 0.0000 [1 of 1 diverged] |" in section.split("##")[0]


def test_the_version_note_counts_the_runs_whose_table_records_no_jaxfl_code():
    # a committed results CSV (no jaxfl_code column) beside a sweep made today: no note at all
    from jaxfl.report import code_note

    note = code_note([{"jaxfl_code": "0.2.0+gaaaaaaaaa"}, {"jaxfl_code": None}, {}])
    assert note.startswith("The runs were made by 1 version and more of jaxfl (the jaxfl_code column of their "
                           "results): 0.2.0+gaaaaaaaaa (1 run); 2 runs record none (made before the column).")
    assert code_note([{}, {"jaxfl_code": None}]) is None  # nothing known: nothing to say


def test_sub_second_times_and_small_ratios_keep_their_digits(tmp_path):
    # a method reaching the target in 0.0191 s against the reference's 5.5 s read "0.00 (0.0 s)": as if at once
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy",
                 ["fedavg,0,5.5,0.9", "fedasync,0,0.0191,0.9", "fedbuff,0,0.062,0.9"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    assert "| fedasync | 0.0035 (0.0191 s) |" in markdown and "| fedbuff | 0.011 (0.062 s) |" in markdown


def test_the_computation_ratio_pairs_the_seeds_as_the_time_ratio_does(tmp_path):
    # the reference without seed 1: FedBuff's steps over FedAvg's were each method's own mean (88 / 114 = 0.77),
    # where the seeds both ran give (84 + 78) / (108 + 120) = 0.71
    table = _csv(tmp_path / "results.csv",
                 "algorithm,seed,time_to_target,best_accuracy,final_accuracy,client_steps_arrived",
                 ["fedavg,0,10.0,0.9,0.9,108", "fedavg,2,10.0,0.9,0.9,120",
                  "fedbuff,0,5.0,0.9,0.9,84", "fedbuff,1,5.0,0.9,0.9,102", "fedbuff,2,5.0,0.9,0.9,78"])
    report = make_report([table], figures=False, out=str(tmp_path / "report"))
    fedbuff = next(line for line in report.rows if line["method"] == "fedbuff")
    assert fedbuff["relative_steps"] == pytest.approx((84 + 78) / (108 + 120))


def test_a_comparisons_table_keeps_a_sub_second_time_to_target():
    from jaxfl.comparison import format_table

    row = {"algorithm": "fedasync", "time_to_target": 0.0191, "best_accuracy": 0.9, "final_accuracy": 0.9,
           "global_updates": 3, "client_steps_executed": 6, "client_utilisation": 1.0, "wall_time_s": 1.0}
    assert format_table([row], 0.8).splitlines()[-1].split()[1] == "0.0191"  # was "0.0"


def test_methods_with_other_numbers_of_runs_are_said_under_the_accuracy_table(tmp_path):
    # the reference without seed 1: its mean ± std over 2 runs, FedBuff's over 3, side by side without a word
    table = _csv(tmp_path / "results.csv", "algorithm,seed,time_to_target,best_accuracy",
                 ["fedavg,0,10.0,0.9", "fedavg,2,10.0,0.9", "fedbuff,0,5.0,0.9", "fedbuff,1,5.0,0.8",
                  "fedbuff,2,5.0,0.9"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "report")).markdown
    assert "The methods have other numbers of runs (fedavg 2, fedbuff 3): each mean is over" in markdown
    full = _csv(tmp_path / "full.csv", "algorithm,seed,time_to_target,best_accuracy",
                ["fedavg,0,10.0,0.9", "fedbuff,0,5.0,0.9"])
    assert "other numbers of runs" not in make_report([full], figures=False, out=str(tmp_path / "r2")).markdown


def test_runs_without_a_target_get_no_table_of_misses(tmp_path):
    # every cell "–", read as "missed the target in at least half of its runs", where no run had a target
    # (a review: a comparison on one's own data, which has no default target)
    table = _csv(tmp_path / "results.csv", "algorithm,seed,target_accuracy,time_to_target,best_accuracy",
                 ["fedavg,0,,,0.9", "fedbuff,0,,,0.8"])
    markdown = make_report([table], figures=False, out=str(tmp_path / "r")).markdown
    assert "No run had a target accuracy, so there are no times to it to compare" in markdown
    assert "Time to first reach" not in markdown and "| fedbuff | – |" not in markdown
    assert "| fedbuff | 0.8000 ± 0.0000 |" in markdown  # the accuracy tables as before
    # a table without the column whose runs have times had a target: its table stays
    table = _csv(tmp_path / "timed.csv", "algorithm,seed,time_to_target,best_accuracy", ["fedavg,0,10,0.9"])
    assert "Time to first reach the target held-out accuracy" in make_report([table], figures=False,
                                                                             out=str(tmp_path / "t")).markdown


def test_a_time_over_the_runs_that_reached_the_target_says_how_many_of_them_did():
    # fedbuff reached the target in 2 of its 3 seeds: its headline "0.85 (3.6 s)" read as every seed's
    def line(method, reached, mean, ratio):
        return {"method": method, "runs": 3, "reached": reached, "time_to_target_mean": mean, "relative_time": ratio,
                "best_accuracy_mean": 0.9, "best_accuracy_std": 0.0, "reference_reached": True}

    text = format_markdown([line("fedavg", 3, 4.5, 1.0), line("fedbuff", 2, 3.6, 0.85)], [], "fedavg", "50%")
    assert "| fedavg | 1.00 (4.5 s) |" in text and "| fedbuff | 0.85 (3.6 s) [2 of 3 reached] |" in text
    assert "[k of n reached] = the method reached the target in k of its n runs" in text
    every = format_markdown([line("fedavg", 3, 4.5, 1.0)], [], "fedavg", "50%")
    assert "reached]" not in every  # no mark, no legend, where every run reached it
