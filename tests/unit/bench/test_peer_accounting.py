"""The side-by-side's accounting (bench/peer_accounting.py, bench/peer_procs.py, bench/peer.py's plan)."""

from __future__ import annotations

import math
import os

import pytest

from bench.peer import FULL, SMOKE, plan_for
from bench.peer_accounting import cpu_figures, load_note, load_verdict, memory_figures, with_floor
from bench.peer_procs import outbound_requests, port_of, pss_kib, stat_cpu_ticks, stat_fields, tree_cpu


def test_cpu_per_turn_counts_every_part_and_the_client_and_subtracts_the_floor() -> None:
    figures = cpu_figures(
        parts_s={"workers": 20.0, "postgres": 4.0, "redis": 1.0, "client": 5.0},
        count=1000,
        span_s=30.0,
        floor_ms=11.5,
        serving_processes=2,
    )
    assert figures.total_ms == pytest.approx(30.0)
    assert figures.parts_ms == pytest.approx({"workers": 20.0, "postgres": 4.0, "redis": 1.0, "client": 5.0})
    assert figures.own_ms == pytest.approx(18.5)
    assert figures.cores_busy == pytest.approx(1.0)
    assert figures.turns_per_s == pytest.approx(1000 / 30)
    assert figures.turns_per_s_per_process == pytest.approx(1000 / 30 / 2)


def test_a_phase_of_no_time_gives_no_rate_rather_than_a_division_error() -> None:
    figures = cpu_figures(parts_s={"server": 1.0}, count=10, span_s=0.0, floor_ms=0.0, serving_processes=0)
    assert math.isnan(figures.turns_per_s) and math.isnan(figures.cores_busy)


def test_memory_is_peak_minus_idle_per_turn_with_both_shown() -> None:
    figures = memory_figures(idle_kib=300 * 1024, peak_kib=400 * 1024, count=200)
    assert (figures.idle_mib, figures.peak_mib, figures.added_mib) == (300, 400, 100)
    assert figures.per_turn_mib == pytest.approx(0.5)


def test_a_figure_is_publishable_only_when_every_run_started_below_load_one_and_a_half() -> None:
    assert load_verdict([0.4, 1.49]) == ""
    assert load_verdict([0.4, 1.5, 3.25]) == "NOT PUBLISHABLE (load 3.25)"
    assert load_verdict([]).startswith("NOT PUBLISHABLE")
    assert load_note([0.62, 0.8]) == "0.62, 0.80 at start -> publishable"
    assert load_note([2.0]) == "2.00 at start -> NOT PUBLISHABLE (load 2.00)"


def test_cpu_figures_are_shown_beside_the_floor() -> None:
    assert with_floor(42.8, 11.4) == "42.8 ms (floor 11.4, own 31.4)"
    assert with_floor(42.8, math.nan) == "42.8 ms"


def test_proc_stat_parsing_survives_a_command_name_with_spaces_and_parentheses() -> None:
    line = "123 (celery (worker) 1) S 1 123 123 0 -1 4194560 10 0 0 0 70 30 5 2 20 0 1 0 100 0 0"
    fields = stat_fields(line)
    assert fields[1] == "1"  # the parent pid
    assert stat_cpu_ticks(fields) == 70 + 30 + 5 + 2


def test_this_process_tree_cpu_is_read_from_proc() -> None:
    assert tree_cpu([os.getpid()]) > 0


def test_pss_is_read_from_smaps_rollup() -> None:
    text = "00400000-7ffd [rollup]\nRss:              20480 kB\nPss:              12345 kB\nPss_Anon: 1 kB\n"
    assert pss_kib(text) == 12345
    assert pss_kib("Rss: 1 kB\n") is None


def test_service_ports_come_from_their_urls() -> None:
    assert port_of("postgresql+psycopg://postgres@127.0.0.1:5433/chatq_bench_peer") == 5433
    assert port_of("redis://127.0.0.1:6380/3") == 6380
    assert port_of("redis://localhost/0") == 6379
    assert port_of("postgresql+psycopg://postgres@localhost/chatq") == 5432


def test_only_requests_beyond_this_machine_count_as_outbound() -> None:
    log = "HTTP Request: POST http://127.0.0.1:8000/v1/chat \x1b[32mHTTP Request: GET https://api.smith.langchain.com/x"
    assert outbound_requests(log) == ["https://api.smith.langchain.com/x"]


def test_the_smoke_plan_is_asked_for_explicitly_and_the_full_plan_is_the_default() -> None:
    assert plan_for(False, {"CHATQ_BENCH_PEER_SMOKE": "1"}) is FULL
    assert plan_for(True, {"CHATQ_BENCH_PEER_SMOKE": "1"}) is SMOKE
    assert plan_for(True, {}).rounds == 1 and plan_for(True, {}).at_once == FULL.at_once
