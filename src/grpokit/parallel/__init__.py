"""Where the step runs: the placement (one process, DDP, FSDP2 or DeepSpeed ZeRO; ``distributed``), the
FSDP2 units and gathers (``fsdp``), the ZeRO engine (``zero``), saving and resuming under each placement
(``run_state``, ``checkpoint``), and a CPU run's threads (``threads``) and allocator/attention settings
(``cpu_runtime``)."""

from grpokit.parallel.distributed import PreparedPolicy, make_accelerator, placement, prepare_policy
from grpokit.parallel.run_state import RunState
from grpokit.parallel.threads import ThreadPolicy

__all__ = ["PreparedPolicy", "RunState", "ThreadPolicy", "make_accelerator", "placement", "prepare_policy"]
