"""What ``olmx run`` sets in its environment before OLMo-core and the CUDA allocator start."""

from __future__ import annotations

from olmx.worker.run import worker_environment


def test_cuda_workers_get_expandable_segments_unless_the_user_chose():
    assert worker_environment("cuda", {}) == {
        "OLMO_SHARED_FS": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_environment("cuda", {key: "max_split_size_mb:512"})


def test_gpu_workers_keep_olmo_cores_per_rank_triton_cache():
    assert "OLMO_DISABLE_PER_RANK_TRITON_CACHE" not in worker_environment("cuda", {})
    assert worker_environment("cpu", {})["OLMO_DISABLE_PER_RANK_TRITON_CACHE"] == "1"
    assert worker_environment("cpu", {"OLMO_SHARED_FS": "0"}) == {"OLMO_DISABLE_PER_RANK_TRITON_CACHE": "1"}
