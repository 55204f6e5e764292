from pathlib import Path

from tests.support.machine_cpu import TICKS, CpuTimes, cpu_times, summary


def test_busy_time_leaves_out_idle_and_iowait_and_counts_guest_time_once(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 10 50 1000 40 5 5 0 30 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n")
    times = cpu_times(str(stat))
    assert times == CpuTimes(busy_s=170 / TICKS, total_s=1210 / TICKS)
    assert cpu_times(str(tmp_path / "missing")) is None
    assert "50 CPU-s busy of 100 available" in summary(CpuTimes(10, 100), CpuTimes(60, 200))
