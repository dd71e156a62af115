"""Model machinery behind the Policy contract.

``hf_policy`` (TransformersPolicy), ``sampling`` (the decoding loop), ``lora`` (one frozen
base shared by per-agent adapters), ``model_source`` (hub ids, folders, GGUF files,
package aliases), ``team`` (building a Team from agent specs), ``simple_policies``
(callable and remote-model policies), ``tiny`` (random-weight test model) and ``cpu/``
(optional CPU speed paths). Import the module you need; nothing is loaded here so that
``import comlrl_core`` stays free of torch.
"""
