"""What ``spawn_suite.py`` gives on a CPU-only machine, world size 3 (torch 2.13.0+cpu).

``GLOO_PASSES``: the tests gloo passes. ``GLOO_ONLY``: those of them that test what torch keeps
for gloo (or that branch on the name "gloo" in their body), with why; every other test of
``GLOO_PASSES`` must pass on pccl_aio (``check_expected.py``). ``KNOWN_GAPS``: those that do
not yet, with the error each gives.
"""

GLOO_PASSES = (
    "test_Backend_enum_class",
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad",
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_all_gather",
    "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty",
    "test_all_gather_complex",
    "test_all_gather_full_group",
    "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup",
    "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_max",
    "test_all_reduce_full_group_min",
    "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_max",
    "test_all_reduce_min",
    "test_all_reduce_product",
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_barrier",
    "test_barrier_full_group",
    "test_barrier_timeout_full_group",
    "test_barrier_timeout_global",
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    "test_broadcast",
    "test_broadcast_full_group",
    "test_ddp_create_graph",
    "test_ddp_logging_data_cpu",
    "test_destroy_full_group",
    "test_destroy_group",
    "test_dump_DDP_relevant_env_vars",
    "test_gather",
    "test_gather_checks",
    "test_gather_full_group",
    "test_get_backend",
    "test_get_future",
    "test_get_rank",
    "test_get_rank_size_full_group",
    "test_get_rank_size_group",
    "test_grads_same_across_ranks_with_no_sync",
    "test_irecv",
    "test_isend",
    "test_isend_autograd_profiler",
    "test_isend_torch_profiler",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_monitored_barrier_gloo_subgroup",
    "test_reduce_full_group_max",
    "test_reduce_full_group_min",
    "test_reduce_full_group_product",
    "test_reduce_full_group_sum",
    "test_reduce_max",
    "test_reduce_min",
    "test_reduce_product",
    "test_reduce_sum",
    "test_reduce_sum_twice",
    "test_scatter",
    "test_scatter_checks",
    "test_scatter_complex",
    "test_scatter_full_group",
    "test_scatter_object_list",
    "test_send_recv",
    "test_send_recv_any_source",
    "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",
    "test_send_recv_autograd_profiler",
    "test_send_recv_torch_profiler",
    "test_send_recv_with_tag",
    "test_send_recv_with_tag_autograd_profiler",
    "test_send_recv_with_tag_torch_profiler",
    "test_sparse_all_reduce_sum",
    "test_static_graph_api_cpu",
)

GLOO_ONLY = {
    "test_monitored_barrier_gloo": "dist.monitored_barrier: ValueError: monitored_barrier is "
    "only implemented for GLOO backend",
    "test_monitored_barrier_gloo_subgroup": "dist.monitored_barrier: gloo only (ValueError)",
    "test_monitored_barrier_gloo_rank_0_timeout": "ProcessGroup.monitored_barrier: gloo only "
    "(RuntimeError: No backend type associated with device type cpu)",
    "test_sparse_all_reduce_sum": "sparse all_reduce, gloo only among torch's backends "
    "(pccl_aio: InvalidUsageError: src is not contiguous)",
    "test_accumulate_gradients_no_sync": "the body builds its model only under "
    "BACKEND == 'gloo' / 'mpi' / 'nccl' (UnboundLocalError: ddp_model)",
    "test_accumulate_gradients_no_sync_grad_is_view": "as test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook": "as test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "as "
    "test_accumulate_gradients_no_sync",
}

_NO_COALESCED = ("RuntimeError: No backend type associated with device type cpu "
                 "(dist.all_gather_coalesced: the group has no allgather_coalesced)")
_BARRIER = ("AssertionError: ' (Timed out|closed|timeout) ' does not match 'barrier tag 0 "
            "aborted: the group's ring changed (epoch 4) after peers [1] launched it; ...' "
            "(rank 0 alone in dist.barrier of a group with a 1 s timeout)")
KNOWN_GAPS = {
    "test_all_gather_coalesced_simple": _NO_COALESCED,
    "test_all_gather_coalesced_complex": _NO_COALESCED,
    "test_all_gather_coalesced_full_group": _NO_COALESCED,
    "test_all_gather_coalesced_with_empty": _NO_COALESCED,
    "test_barrier_timeout_full_group": _BARRIER,
    "test_barrier_timeout_global": _BARRIER,
}
