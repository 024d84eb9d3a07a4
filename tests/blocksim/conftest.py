import pytest

from blocksim.memory.paged import BlockSpaceManager
from blocksim.sequence import SequenceGroup


def make_group(prompt: int, output: int = 10, n: int = 1, index: int = 0, arrival_s: float = 0.0,
               first_seq_id: int = 0) -> SequenceGroup:
    return SequenceGroup(index, index, arrival_s, prompt, output, n, 0, first_seq_id)


@pytest.fixture
def bm():
    return BlockSpaceManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=10, watermark_blocks=0)
