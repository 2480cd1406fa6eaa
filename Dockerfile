# buildmatrix's own image: what the admission DaemonSet of `buildmatrix k8s manifests`
# runs (docs/kubernetes.md). The wheels come from the build context, so the build
# itself needs no network:
#
#   python3 -m pip wheel -w dist .          # buildmatrix and every dependency
#   docker build -t buildmatrix .
#
# PYTHON_BASE: any image with python3 (3.11 or newer) and pip.
ARG PYTHON_BASE=python:3.11-slim
FROM ${PYTHON_BASE}
COPY dist/ /tmp/wheels/
RUN python3 -m pip install --no-cache-dir --no-index --find-links /tmp/wheels buildmatrix-gpu \
    && rm -rf /tmp/wheels
# NVML needs no root: the NVIDIA container toolkit gives the device nodes (0666) and
# the driver's libraries to any user.
USER 65532:65532
ENTRYPOINT ["buildmatrix"]
