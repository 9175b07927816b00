"""GPU memory a first run can trust (vitlarge/train/memory.py; issue 31 item 5).

The allocator's setting before torch reads it, kept where the user set either name; each rank's start
line; the peaks a step reports. No GPU here: the CUDA branches run with torch.cuda's device queries faked.
The console's and metrics.jsonl's columns are in tests/unit/hooks/test_hooks.py.
"""

from __future__ import annotations

import socket

import torch

from vitlarge.train import memory

CUDA = torch.device("cuda", 0)


def test_expandable_segments_is_set_unless_the_user_set_either_name():
    env: dict[str, str] = {}
    assert memory.configure_allocator(env) == (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (vitlarge's; set PYTORCH_ALLOC_CONF to choose another)"
    )
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for var in memory.ALLOC_VARS:  # torch 2.9+ reads PYTORCH_ALLOC_CONF first; the older name still counts
        env = {var: "max_split_size_mb:512"}
        assert memory.configure_allocator(env) == f"{var}=max_split_size_mb:512 (yours)"
        assert env == {var: "max_split_size_mb:512"}  # untouched, and the other name not added
    env = {"PYTORCH_CUDA_ALLOC_CONF": ""}  # set empty: torch's defaults, as if unset
    memory.configure_allocator(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_each_rank_says_its_gpus_free_and_total_memory_on_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(139.28 * 2**30), int(139.81 * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert memory.gpu_start_line(CUDA, 3, env) == (
        f"rank 3 on {socket.gethostname()} cuda:0 (NVIDIA H200): GPU memory 139.28 GiB free of 139.81 GiB; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    assert memory.gpu_start_line(CUDA, 0, {}).endswith("; allocator defaults")
    assert memory.gpu_start_line(torch.device("cpu"), 0, env) == ""


def test_peaks_are_allocated_and_reserved_on_cuda_and_rss_alone_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 20 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 24 * 2**30)
    assert memory.peak_memory(CUDA) == (20 * 2**30, 24 * 2**30)
    rss, reserved = memory.peak_memory(torch.device("cpu"))
    assert reserved is None and rss > 2**20  # this process's max RSS: a Python with torch holds more than 1 MiB
