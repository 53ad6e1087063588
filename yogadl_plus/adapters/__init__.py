"""Framework faces (tf.data, PyTorch, Keras, Grain) over Stream and DataRef; each imports its
framework lazily, only when used."""
