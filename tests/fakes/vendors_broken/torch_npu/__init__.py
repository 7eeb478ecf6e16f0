"""Fake torch_npu installed without CANN: importing it fails as the real one does."""

raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
