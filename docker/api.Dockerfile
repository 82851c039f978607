# An api pod: Sanic + the job client. No llama.cpp in this image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api api
COPY scheduler scheduler
COPY storage storage
COPY llamaq llamaq
RUN pip install .
EXPOSE 9931
ENTRYPOINT ["llamaq", "api", "--host", "0.0.0.0"]
