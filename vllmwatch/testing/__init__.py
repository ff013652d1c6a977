"""Fakes for tests, in the source tree only: the .deb leaves vllmwatch/testing/ out
(docs/operations/install.md, "The fakes are not in the package").

Empty on purpose: the fake vLLM (`python -m vllmwatch.testing.fake_vllm`) starts three
interpreters per launch, and each imported the whole daemon through this package while it
held the pure-core driver; on a loaded 2-core CI box that was seconds per launch. The driver
lives in vllmwatch.testing.driver.
"""
