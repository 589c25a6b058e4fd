"""Several processes and machines (torchrun: DDP or FSDP)."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError


@dataclass
class ProcessSettings:
    # ---- several processes
    nproc: int = setting(1, "processes on this machine: one per GPU (DDP), or with --device cpu N CPU processes "
                         "(gloo)", ge=1, metavar="N", group="processes",
                zh=("进程数", "本机的进程数：每个 GPU 一个（DDP），或配合“设备”cpu 使用 N 个 CPU 进程（gloo）"))
    fsdp: bool = setting(False, "shard the model over the processes (FSDP) instead of a full copy in each",
                         group="processes",
                zh=("FSDP 分片", "把模型分片到各进程（FSDP），而不是每个进程一份完整副本"))
    nnodes: int = setting(1, "machines taking part; run the same command on each with its own --node-rank", ge=1,
                          metavar="N", group="processes",
                zh=("机器数", "参与的机器数；在每台机器上运行同一条命令并给出各自的 --node-rank"))
    node_rank: int = setting(0, "this machine's number, 0..nnodes-1 (0 writes the outputs)", ge=0, metavar="I",
                             group="processes",
                zh=("机器编号", "这台机器的编号，0..nnodes-1（0 号写输出）"))
    master_addr: str = setting("", "address of node 0, reachable from every node", metavar="HOST", group="processes",
                zh=("主节点地址", "0 号节点的地址，所有节点都要能访问"))
    master_port: int = setting(0, "free TCP port on node 0 (0: 29500, or any free port on one machine)", ge=0,
                               le=65535, metavar="PORT", group="processes",
                zh=("主节点端口", "0 号节点上空闲的 TCP 端口（0：29500，或单机时任意空闲端口）"))
    rendezvous_timeout: int = setting(600, "seconds each node of a multi-node run waits for the others to report at "
                                      "node 0 before it gives up", ge=1, metavar="S", group="processes",
                zh=("等待其他节点（秒）", "多机训练时每个节点等待其他节点在 0 号节点报到的秒数，超时即放弃"))

    def check(self) -> None:
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes} "
                              f"(got {self.node_rank})")
        if self.fsdp and self.nproc * self.nnodes < 2:
            raise ConfigError("--fsdp shards the model over several processes; add --nproc N (N >= 2)")
