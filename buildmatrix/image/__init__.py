"""Container images as buildmatrix reads them: references, sources and layers."""
