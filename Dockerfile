# The image of every turnlog program in docker-compose.yml: the gateway, the workers, the
# projector, the memory and analytics consumers. Your agents are mounted, not built in.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY engine engine
COPY projections projections
COPY consumers consumers
COPY gateway gateway
COPY turnlog turnlog
COPY examples examples
RUN pip install --no-cache-dir ".[gateway,memory]"
ENTRYPOINT []
