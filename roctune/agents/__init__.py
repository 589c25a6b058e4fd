"""Agent episodes with the user's tools: the tool process and its limits (sandbox, worker), and the loop of model
turns and tool turns (episodes) that GRPO's rollouts, `roctune eval --tools` and `roctune chat --tools` share."""
