"""Native readers for CUDA binaries: ELF sections, fatbinaries, cubins and PTX text.

No CUDA toolkit is needed; only headers are read, never payloads, so that a
multi-gigabyte library costs a few thousand small reads.
"""
