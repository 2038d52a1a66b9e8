"""The launcher behind ``python -m pccl_aio.launch``: processes (``runner``), what it keeps of a
run (``record``) and what it writes at the end (``report``)."""
