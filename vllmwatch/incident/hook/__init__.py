"""The folder vllmwatch puts first on vLLM's PYTHONPATH: its sitecustomize registers
faulthandler in every vLLM process (a package only so that the wheel ships the file)."""
