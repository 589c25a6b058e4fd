"""Evaluation of a fine-tune against its base model on held-out records (`roctune eval`): teacher-forced loss and
perplexity computed exactly as training computes them, generation metrics (BLEU-4, ROUGE-1/2/L, exact match)
against the reference answers, an HTML/Markdown report with every example, and optional lm-evaluation-harness
tasks. Modules: `scoring` (run the models), `metrics` (the text metrics), `report` (files), `harness` (lm-eval),
`rewards` (GRPO's reward functions: built-ins, a user's reward file, checked calls) and `rewarded` (base vs tuned
scored by those rewards on held-out prompts: `roctune eval --reward`)."""
