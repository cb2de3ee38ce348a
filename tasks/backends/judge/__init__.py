"""The judge of evaluation: an LLM that compares each checkpoint's held-out answers with
reference answers (``llm``), and where those reference answers come from (``reference``)."""
