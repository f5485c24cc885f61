# kvproxy: an OpenAI-compatible server with a persistent, shared prefix KV cache.
FROM python:3.11-slim

# NOTE: a C++ compiler: the native decode step is built at the first start, for the CPU it runs
# on (engine/kernels/build.py); without one the server decodes with torch, several times slower.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

# NOTE: the CPU build of torch, from PyTorch's CPU wheel index: the default PyPI wheel carries
# several GB of CUDA libraries this image never uses.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY pyproject.toml README.md ./
COPY hashing ./hashing
COPY store ./store
COPY engine ./engine
COPY proxy ./proxy
COPY bench ./bench
RUN pip install --no-cache-dir .

ENV KVPROXY_HOST=0.0.0.0 \
    KVPROXY_PORT=8000 \
    KVPROXY_CACHE_DIR=/data/models \
    KVPROXY_BLOB_DIR=/data/blobs
VOLUME ["/data/models", "/data/blobs"]
EXPOSE 8000 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=180s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
CMD ["kvproxy", "serve"]
