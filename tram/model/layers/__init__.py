"""Layers shared by the model families (tram/model/models/): each family file is an assembly of these,
imported from their modules (this package imports nothing, so that a layer's module can be imported
alone, e.g. linear.py by the quantized weights).

Module and parameter names equal Hugging Face's, so checkpoints load by name.
"""
