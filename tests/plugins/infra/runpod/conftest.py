"""The RunPod tests' fixtures (:mod:`runpod_testing`): the fake API, the stand-in ssh, an SSH key."""

from runpod_testing import fake, fake_ssh, ssh_identity

__all__ = ["fake", "fake_ssh", "ssh_identity"]
