"""Models: parameters, layers, decoder, MTP head, decode state."""
