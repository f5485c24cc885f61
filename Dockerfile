# kvproxy: an OpenAI-compatible server with a persistent, shared prefix KV cache. docker-compose.yml
# builds it once, as kvproxy:local, and runs every kvproxy service from it.

# The dependencies pyproject.toml names, as a requirements file: the stage below copies this file,
# so its dependency layer is rebuilt when the list changes, not when anything else in pyproject.toml does.
FROM python:3.11-slim AS requirements
COPY pyproject.toml /
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/pyproject.toml', 'rb'))['project']['dependencies']))" \
    > /requirements.txt

FROM python:3.11-slim

# NOTE: a C++ compiler: the native decode step is built at the first start, for the CPU it runs
# on (engine/kernels/build.py); without one the server decodes with torch, several times slower.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

# NOTE: the CPU build of torch: the default PyPI wheel carries several GB of CUDA libraries this
# image never uses. TORCH_INSTALL is what pip installs it from: PyTorch's CPU wheel index by
# default; where that index is out of reach, put a CPU wheel in deploy/wheels/ (ignored by git,
# copied in here) and name it, e.g.
#   docker compose build --build-arg TORCH_INSTALL='/tmp/wheels/torch-2.13.0+cpu-*.whl'
# (the wheel stays in its copy's layer: about 190 MB more in such a local image).
ARG TORCH_INSTALL="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
COPY deploy/wheels/ /tmp/wheels/
RUN pip install --no-cache-dir $TORCH_INSTALL && rm -rf /tmp/wheels

# NOTE: the dependencies before the sources, each in its own layer: a code change reinstalls
# kvproxy alone (seconds), not every dependency (minutes)
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt

WORKDIR /app
COPY pyproject.toml README.md ./
COPY hashing ./hashing
COPY store ./store
COPY engine ./engine
COPY proxy ./proxy
COPY bench ./bench
RUN pip install --no-cache-dir --no-deps .

# NOTE: settings of both `kvproxy serve` and `kvproxy route` only (a KVPROXY_* variable that is no
# setting of the command started is warned about). No VOLUME: an image volume becomes an anonymous
# volume per container, which `docker compose down` keeps; compose mounts named volumes instead.
ENV KVPROXY_HOST=0.0.0.0 \
    KVPROXY_PORT=8000 \
    KVPROXY_CACHE_DIR=/data/models
EXPOSE 8000 8080
# NOTE: a first start of its own (no compose `model` service before it) fetches and converts the
# model before it serves: minutes on a slow machine
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
CMD ["kvproxy", "serve"]
