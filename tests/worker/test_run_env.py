"""What ``olmx run`` sets in its environment before OLMo-core and the CUDA allocator start."""

from __future__ import annotations

from olmx.worker.run import worker_environment


def test_cuda_workers_get_expandable_segments_and_the_flight_recorder_unless_the_user_chose():
    env = worker_environment("cuda", {}, "/runs/r/hang")
    assert env["OLMO_SHARED_FS"] == "1" and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # the NCCL Flight Recorder is on, under torch 2.11's names and later ones, dumping into the run
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/runs/r/hang/nccl_trace_rank_"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in worker_environment("cuda", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert not any(k.startswith("TORCH_") for k in worker_environment("cpu", {}))
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_environment("cuda", {key: "max_split_size_mb:512"})


def test_gpu_workers_keep_olmo_cores_per_rank_triton_cache():
    assert "OLMO_DISABLE_PER_RANK_TRITON_CACHE" not in worker_environment("cuda", {})
    assert worker_environment("cpu", {})["OLMO_DISABLE_PER_RANK_TRITON_CACHE"] == "1"
    assert worker_environment("cpu", {"OLMO_SHARED_FS": "0"}) == {"OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1"}


def test_workers_share_the_cores_unless_the_user_set_omp_num_threads():
    from olmx.launch import SHARE_CORES_ENV, threads_env
    from olmx.worker.run import share_cores

    # olmx train with OMP_NUM_THREADS unset: the launcher marks it (and gives torchrun 1, so that
    # torchrun neither warns nor hides that the user set nothing); each worker takes its share
    launched = {**threads_env({}), "OMP_NUM_THREADS": "1"}  # what torchrun passes on
    assert launched[SHARE_CORES_ENV] == "1"
    assert share_cores(2, launched, cores=2) == (1, "2 cores / 2 local processes")
    assert share_cores(4, launched, cores=16) == (4, "16 cores / 4 local processes")
    assert share_cores(4, {}, cores=2) == (1, "2 cores / 4 local processes")  # never 0; no launcher: the same
    # the user's OMP_NUM_THREADS is kept (torchrun passes it on unchanged)
    assert threads_env({"OMP_NUM_THREADS": "1"}) == {}
    assert share_cores(2, {"OMP_NUM_THREADS": "1"}, cores=2) == (1, "OMP_NUM_THREADS set by the user")
    assert share_cores(2, {"OMP_NUM_THREADS": "3"}, cores=2) == (3, "OMP_NUM_THREADS set by the user")


def test_a_users_omp_num_threads_reaches_the_workers_and_nothing_says_8(tmp_path):
    """A real 2-process run with OMP_NUM_THREADS=3 exported: each worker runs 3 threads, says so
    once, and OLMo-core's misleading "already set to '8'" (its own default) is gone."""
    from tests.conftest import olmx_cli
    from tests.test_training import SMALL

    run_dir = tmp_path / "run"
    proc = olmx_cli("train", *SMALL, "trainer.max_steps=1", f"trainer.run_dir={run_dir}", env={"OMP_NUM_THREADS": "3"})
    log = (run_dir / "logs" / "node0.log").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-3000:]
    assert log.count("3 thread(s) per process (OMP_NUM_THREADS set by the user)") == 1  # rank 0 says it
    assert "already set to '8'" not in log and "Setting OMP_NUM_THREADS environment variable" not in log
