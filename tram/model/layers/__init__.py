"""Layers shared by the model families (tram/model/models/): each family file is an assembly of these.

Module and parameter names equal Hugging Face's, so checkpoints load by name.
"""
from tram.model.layers.activation import ACTIVATIONS, get_activation
from tram.model.layers.attention import Attention
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import GemmaRMSNorm, RMSNorm

__all__ = ["ACTIVATIONS", "Attention", "GatedMLP", "GemmaRMSNorm", "LMHead", "RMSNorm", "VocabEmbedding",
           "get_activation"]
