"""Drop-ins for model libraries: ``workbench.torch.integrations.transformers`` patches the DSA
indexers of Hugging Face transformers models (DeepSeek-V3.2, GLM-5) to select with HyTopK."""
