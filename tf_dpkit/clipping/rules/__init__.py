"""Fast-path layer rules, one file per layer, registered on their exact class.

See ``registry`` for the rule contract.  Importing this package registers the built-in rules.
"""
from tf_dpkit.clipping.rules import (conv, dense, depthwise_conv, einsum_dense, embedding,
                                     group_normalization, layer_normalization, recurrent)
from tf_dpkit.clipping.rules._linear import LinearNorms, group_examples
from tf_dpkit.clipping.rules.registry import LayerTrace, lookup_rule, register_layer_rule

__all__ = ["LayerTrace", "LinearNorms", "group_examples", "lookup_rule", "register_layer_rule"]
