"""Two DiLoCo islands on one GPU, for the GPU check (machines here have one): NCCL refuses two ranks
on one device, so the islands' group is torchft's gloo group, with the outer gradients and torchft's
FP8 kernels still on CUDA.

gloo takes CUDA tensors for its all-reduce and all-to-all, but its coalesced all-gather (the second
collective of torchft's FP8 all-reduce, collectives.allreduce_quantized) has no CUDA path: it would
hand gloo a device pointer as host memory. So `HostStagedGloo` copies the two collectives' CUDA
tensors to host memory, runs them there and copies the result back before returning a finished
work: the bytes on the wire are the FP8 ones torchft's kernels wrote, only their transport differs
from NCCL's. Blocking, which a test's two islands can afford.
"""

from __future__ import annotations

import torch
from torchft.process_group import ProcessGroupGloo


def _on_host(tensors: list[torch.Tensor]) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


class HostStagedGloo(ProcessGroupGloo):
    """torchft's gloo group whose all-to-all and coalesced all-gather stage CUDA tensors through host memory."""

    def alltoall_base(self, output_buffer: torch.Tensor, input_buffer: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: object):
        if _on_host([output_buffer, input_buffer]):
            return super().alltoall_base(output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts)
        out = output_buffer.cpu()
        work = super().alltoall_base(out, input_buffer.cpu(), output_split_sizes, input_split_sizes, opts)
        work.wait()
        output_buffer.copy_(out)
        return work

    def allgather_into_tensor_coalesced(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                                        opts: object):
        if _on_host([*output_tensors, *input_tensors]):
            return super().allgather_into_tensor_coalesced(output_tensors, input_tensors, opts)
        outs = [t.cpu() for t in output_tensors]
        work = super().allgather_into_tensor_coalesced(outs, [t.cpu() for t in input_tensors], opts)
        work.wait()
        for t, o in zip(output_tensors, outs):
            t.copy_(o)
        return work
