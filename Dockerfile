# The image of turnlog's workers and projector (docker-compose.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY engine engine
COPY projections projections
COPY consumers consumers
COPY turnlog turnlog
COPY examples examples
RUN pip install --no-cache-dir .
ENTRYPOINT []
