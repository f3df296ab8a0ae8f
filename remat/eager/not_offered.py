"""DeepSpeed activation-checkpointing names remat.checkpointing does not offer, each with what to use instead
(the module's __getattr__ names it in its AttributeError)."""

# DeepSpeed's names that are not offered, with what to use instead.
_PARTITIONING = "remat partitions checkpointed inputs itself: configure(mpu_, partition_activations=True)"
_OFFLOAD = "remat offloads checkpointed inputs itself: configure(checkpoint_in_cpu=True)"
_INTERNAL = (
    "an internal helper of DeepSpeed's CheckpointFunction; checkpoint(fn, *args, **kwargs) handles tensor "
    "and non-tensor arguments itself"
)
_STATE = (
    "remat keeps the settings in one record: read it with get_settings(), is_configured(); change it with "
    "configure(...), set_num_layers(n), partition_activations_in_checkpoint(flag)"
)
NOT_OFFERED = {
    **dict.fromkeys(
        (
            "get_partition_start",
            "get_partition_size",
            "partition_activations",
            "gather_partitioned_activations",
            "get_partitioned_activations_for_backward",
        ),
        _PARTITIONING,
    ),
    **dict.fromkeys(
        ("get_cpu_activations_for_backward", "get_offloaded_activations_for_backward", "restore_offloaded_activations"),
        _OFFLOAD,
    ),
    **dict.fromkeys(("extract_tensors", "merge_tensors", "is_activation_to_checkpoint"), _INTERNAL),
    **dict.fromkeys(
        (
            "mpu",
            "mp_rank",
            "mp_size",
            "mp_group",
            "num_layers",
            "PARTITION_ACTIVATIONS",
            "CONTIGUOUS_CHECKPOINTING",
            "CPU_CHECKPOINT",
            "SYNCHRONIZE",
            "PROFILE_TIME",
            "timers",
            "deepspeed_checkpointing_enabled",
            "contiguous_data_buffers",
            "contiguous_size_buffers",
            "data_offsets",
            "size_offsets",
        ),
        _STATE,
    ),
}
