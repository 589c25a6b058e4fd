"""The models a newcomer can start from: one row each, of a family roctune has a spec for (roctune.families), the
tutorials' Qwen2.5 Instruct models first. `roctune models list` and the web UI's model picker show this table;
`roctune models pull ID` downloads a row (or any other hub id) through roctune.hub. Nothing here imports torch.

`params` is the parameter count in billions (the model card's figure); the download is about 2 bytes per parameter
(the hubs publish these models in bf16). `licence` is the licence named on the model card; `gated` marks a model
whose hub page asks you to accept its licence and log in before downloading. `modelscope` is the id on ModelScope
where it differs from the Hugging Face id (Meta's and Google's models are republished there by LLM-Research).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogModel:
    id: str                 # Hugging Face hub id
    params: float           # billions
    licence: str
    family: str             # roctune.families.Family.name
    gated: bool = False
    modelscope: str = ""    # the ModelScope id, when not the same as `id`

    @property
    def size(self) -> str:
        return f"{self.params * 1000:.0f}M" if self.params < 0.4 else f"{self.params:g}B"

    @property
    def download_gb(self) -> float:
        return round(self.params * 2, 1)


CATALOG: tuple[CatalogModel, ...] = (
    CatalogModel("Qwen/Qwen2.5-0.5B-Instruct", 0.49, "apache-2.0", "qwen2"),
    CatalogModel("Qwen/Qwen2.5-1.5B-Instruct", 1.5, "apache-2.0", "qwen2"),
    CatalogModel("Qwen/Qwen2.5-3B-Instruct", 3.1, "qwen-research", "qwen2"),
    CatalogModel("Qwen/Qwen2.5-7B-Instruct", 7.6, "apache-2.0", "qwen2"),
    CatalogModel("HuggingFaceTB/SmolLM2-135M-Instruct", 0.135, "apache-2.0", "llama"),
    CatalogModel("HuggingFaceTB/SmolLM2-360M-Instruct", 0.36, "apache-2.0", "llama"),
    CatalogModel("HuggingFaceTB/SmolLM2-1.7B-Instruct", 1.7, "apache-2.0", "llama"),
    CatalogModel("Qwen/Qwen3-0.6B", 0.6, "apache-2.0", "qwen3"),
    CatalogModel("Qwen/Qwen3-1.7B", 1.7, "apache-2.0", "qwen3"),
    CatalogModel("Qwen/Qwen3-4B", 4.0, "apache-2.0", "qwen3"),
    CatalogModel("meta-llama/Llama-3.2-1B-Instruct", 1.24, "llama3.2", "llama", gated=True,
                 modelscope="LLM-Research/Llama-3.2-1B-Instruct"),
    CatalogModel("meta-llama/Llama-3.2-3B-Instruct", 3.2, "llama3.2", "llama", gated=True,
                 modelscope="LLM-Research/Llama-3.2-3B-Instruct"),
    CatalogModel("google/gemma-3-270m-it", 0.27, "gemma", "gemma3", gated=True,
                 modelscope="LLM-Research/gemma-3-270m-it"),
    CatalogModel("google/gemma-3-1b-it", 1.0, "gemma", "gemma3", gated=True, modelscope="LLM-Research/gemma-3-1b-it"),
)
BY_ID = {m.id.lower(): m for m in CATALOG}


def catalog_entry(model_id: str) -> CatalogModel | None:
    """The catalog row of a Hugging Face id (any letter case), or None."""
    return BY_ID.get(model_id.strip().lower())
