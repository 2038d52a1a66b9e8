"""The ``torch.distributed`` backend behind ``pccl_aio.torch`` (imports torch)."""
