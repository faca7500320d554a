"""Summaries, shared by the recipes that write them (summarization, distillation): data and prompts, ROUGE,
generation and timing, the comparison steps and tables."""
