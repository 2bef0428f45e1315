# The feedline image: `feedline dispatcher`, `feedline worker` and trainers that read the
# service (torchrun). Build from the repository root:
#   docker build -t feedline:0.1.0 .
# deploy/kubernetes and deploy/slurm run it; docs/deployment.md says how.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A user of its own, never root: the dispatcher refuses work-dir files that another user owns,
# and a worker runs the code of the datasets it is given.
RUN groupadd --gid 10001 feedline \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/feedline feedline

WORKDIR /opt/feedline
COPY pyproject.toml README.md ./
COPY src ./src
# CPU wheels of torch keep the image small; a GPU trainer image installs the CUDA wheels instead
# (--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --extra-index-url "${TORCH_INDEX}" ".[torch,s3,gcs,azure]" \
    && rm -rf /opt/feedline/src /root/.cache

USER 10001:10001
WORKDIR /home/feedline
ENTRYPOINT ["feedline"]
CMD ["--help"]
