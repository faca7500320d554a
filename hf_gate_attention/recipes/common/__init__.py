"""What the recipes share, so that none imports another: the config base and its files, the command-line
runner, the results folder, training with the Trainer, distributed launches, bootstrap statistics, plots,
report commands, archive-backed data, and (`summaries`) the summary generation and ROUGE of the recipes that
write summaries."""
